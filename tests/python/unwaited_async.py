"""A torchrun job that ends, or raises, with an async save in flight: python unwaited_async.py
ROOT raise|exit. At exit the save must finish and the processes end (unwaited_async.sh checks)."""

import atexit
import os
import sys

import torch
import torch.distributed as dist

import shardckpt

# Registered first, so it runs last, after shardckpt's own exit work (which finishes the save):
# torch 1.13 aborts now and then while tearing a gloo group down at interpreter exit (see
# conftest.py), which is not what this test is about.
status = [0]
atexit.register(lambda: (sys.stdout.flush(), sys.stderr.flush(), os._exit(status[0])))

dist.init_process_group("gloo")
rank = dist.get_rank()
shardckpt.async_save({"w": torch.arange(12.0) + 1, "mine": shardckpt.PerRank(rank)}, sys.argv[1], step=3)
if sys.argv[2] == "raise":
    status[0] = 1
    raise RuntimeError("loss is NaN")
