"""A rank of a torchrun job of 2 that saves (peer_dies.sh): rank 1 is killed inside the save
(SHARDCKPT_FAILPOINTS), and rank 0 prints what the save raised there."""
import sys

import torch
import torch.distributed as dist

import shardckpt

dist.init_process_group("gloo")
rank = dist.get_rank()
state = {"w": shardckpt.FlatShard(torch.full((1000,), float(rank)), [2000], 1000 * rank)}
try:
    shardckpt.save(state, sys.argv[1], step=1)
    print("rank %d: saved" % rank, flush=True)
except shardckpt.ShardckptError as error:
    print("rank %d raised %s: %s" % (rank, type(error).__name__, error.message), flush=True)
