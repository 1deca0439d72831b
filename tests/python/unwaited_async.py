"""A torchrun job that ends, or raises, with an async save in flight: python unwaited_async.py
ROOT raise|exit|destroy|twice. At exit the save must finish and the processes end; one that
fails with no wait() to see it is logged (unwaited_async.sh checks). destroy: the job destroys its process group with the save in flight. twice: a second
save follows the first (which a failpoint fails) unwaited, then is waited for."""

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
if sys.argv[2] == "destroy":
    dist.destroy_process_group()
if sys.argv[2] == "twice":
    shardckpt.async_save({"w": torch.arange(12.0) + 2, "mine": shardckpt.PerRank(rank)}, sys.argv[1], step=4).wait()
