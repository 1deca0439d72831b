"""A rank of a torchrun job of 2 that saves (peer_dies.sh): rank 1 is killed inside the save
(SHARDCKPT_FAILPOINTS), and rank 0 prints what the save raised there.

With "deadline" after the root: the ranks save step 1 together, then rank 0 saves step 2 while
rank 1 loads, so each waits in a collective the other never joins; each catches the
DeadlineExceeded, destroys the process group and ends its script, and the process must exit."""
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
    if sys.argv[2:] == ["deadline"]:
        if rank == 1:
            shardckpt.load(state, sys.argv[1])
        else:
            shardckpt.save(state, sys.argv[1], step=2)
except shardckpt.ShardckptError as error:
    print("rank %d raised %s: %s" % (rank, type(error).__name__, error.message), flush=True)
if sys.argv[2:] == ["deadline"]:
    dist.destroy_process_group()
    print("rank %d: end of script" % rank, flush=True)
