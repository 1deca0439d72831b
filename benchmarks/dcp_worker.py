"""PyTorch Distributed Checkpoint's side of benchmarks/bench_dcp.py (run under mpirun, one
process per rank, gloo on CPU). Mirrors bench_dcp_peer exactly: T tensors [rows, 4096] float32
as DTensors sharded on dim 0 over this run's ranks; `save` writes them with
torch.distributed.checkpoint.save (fsync on, DCP's default), `load` loads into the same layout at
this run's world size (resharded when it differs from the saving run's) and checks every value.
Rank 0 prints one JSON line: {"mode", "seconds", "bytes"}."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


def expected_block(t, rows, lo, hi):
    index = torch.arange(lo * 4096, hi * 4096, dtype=torch.int64)
    return ((index + 7919 * t) % 65521).to(torch.float32).reshape(hi - lo, 4096)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["save", "load"])
    p.add_argument("--dir", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--port", default="29533")
    a = p.parse_args()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", a.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    # torch.chunk blocks, as DTensor Shard(0) places them and as shardckpt's ChunkLayout does.
    per = -(-a.rows // world)
    lo, hi = min(rank * per, a.rows), min((rank + 1) * per, a.rows)
    state = {}
    for t in range(a.tensors):
        local = expected_block(t, a.rows, lo, hi) if a.mode == "save" else torch.empty(hi - lo, 4096)
        state[f"layers.{t}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                         shape=torch.Size([a.rows, 4096]), stride=(4096, 1))
    dist.barrier()
    start = time.perf_counter()
    if a.mode == "save":
        dcp.save(state, checkpoint_id=a.dir)
    else:
        dcp.load(state, checkpoint_id=a.dir)
    dist.barrier()
    seconds = time.perf_counter() - start
    if a.mode == "load":
        for t in range(a.tensors):
            if not torch.equal(state[f"layers.{t}.weight"].to_local(), expected_block(t, a.rows, lo, hi)):
                print(f"dcp_worker: rank {rank}: tensor {t} loaded wrong", file=sys.stderr)
                sys.exit(1)
    if rank == 0:
        print(json.dumps({"mode": a.mode, "seconds": seconds, "bytes": a.rows * 4096 * 4 * a.tensors}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
