"""A rank of a job that saves (peer_dies.sh: torchrun, 2 ranks; store_host_dies.sh: 3 processes
started with env://): a rank is killed inside the save (SHARDCKPT_FAILPOINTS), and the others
print what the save raised there.

With "deadline" after the root: the ranks save step 1 together, then rank 0 saves step 2 while
rank 1 loads, so each waits in a collective the other never joins; each catches the
DeadlineExceeded, destroys the process group and ends its script, and the process must exit."""
import sys

import torch
import torch.distributed as dist

import shardckpt

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
state = {"w": shardckpt.FlatShard(torch.full((1000,), float(rank)), [1000 * world], 1000 * rank)}
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
