"""Writes DCP folders with torch 2.x's own dcp.save, for the DCP reading tests.

    python dcp_read_gen.py single OUT       # one process, no process group: plain tensors
    torchrun --nproc_per_node 2 dcp_read_gen.py dist OUT   # 2 ranks, gloo: DTensors
    python dcp_read_gen.py big OUT GIB      # under torchrun, 2 ranks: a large Shard(0) model

Each folder gets a sibling OUT.full.pt: the full state dict as torch.save wrote it (tensors
whole, byte items as they are), which the tests compare every shardckpt result with.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def plain_state():
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(5, 7, generator=g),
        "step": 17,  # a byte item between tensors: consolidation keeps it there
        "half": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "f16": torch.randn(9, generator=g).to(torch.float16),
        "ids": torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4),
        "mask": torch.tensor([1, 0, 1, 1], dtype=torch.uint8),
        "i32": torch.arange(10, dtype=torch.int32),
        "scalar": torch.tensor(2.5),
        "nested": {"inner": {"b": torch.arange(6, dtype=torch.float64).reshape(2, 3)}, "c": torch.ones(2)},
        "name": "run-a",
        "lr": 0.25,
    }


def dist_state(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(11)
    full = {
        "rows": torch.randn(7, 5, generator=g),  # Shard(0): 4 + 3 rows
        "cols": torch.randn(3, 9, generator=g),  # Shard(1): 5 + 4 columns
        "bf": torch.randn(5, 6, generator=g).to(torch.bfloat16),  # Shard(0), bf16
        "tok": torch.arange(33, dtype=torch.int64).reshape(11, 3),  # Shard(0), int64: 6 + 5
        "i8": torch.arange(-10, 10, dtype=torch.int8).reshape(4, 5),  # Shard(1): 3 + 2
        "plain": torch.randn(4, generator=g),  # a plain tensor, the same on every rank
        "opt": {"exp_avg": torch.randn(7, 5, generator=g), "meta": {"betas": torch.tensor([0.9, 0.99])}},
    }
    placements = {"rows": Shard(0), "cols": Shard(1), "bf": Shard(0), "tok": Shard(0), "i8": Shard(1),
                  "opt.exp_avg": Shard(0)}

    def place(name, t):
        p = placements.get(name)
        return distribute_tensor(t, mesh, [p]) if p is not None else t

    sd = {}
    for k, v in full.items():
        if isinstance(v, dict):
            sd[k] = {"exp_avg": place("opt.exp_avg", v["exp_avg"]), "meta": v["meta"]}
        else:
            sd[k] = place(k, v)
    sd["epoch"] = 3
    sd["tags"] = ["a", "b"]
    full["epoch"] = 3
    full["tags"] = ["a", "b"]
    return sd, full


def big_state(rank, world, gib):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    total = int(gib * (1 << 30))
    rows, cols = 4099, 8192  # an uneven row count: 3 ranks split it into unequal pieces
    per = rows * cols * 4
    sd = {}
    for i in range(max(1, -(-total // per))):  # at least `gib`
        # Each rank builds only its own rows (the full tensor would double the memory).
        local = torch.full(((rows + world - 1) // world if rank == 0 else rows - (rows + world - 1) // world, cols),
                           float(i + 1) + rank * 0.5)
        from torch.distributed.tensor import DTensor
        sd[f"layer{i}.w"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                 shape=torch.Size([rows, cols]),
                                                 stride=(cols, 1))
    return sd


def main():
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "single":
        sd = plain_state()
        dcp.save(sd, checkpoint_id=out, no_dist=True)
        torch.save(plain_state(), out + ".full.pt")
        return
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "dist":
        sd, full = dist_state(rank, world)
        dcp.save(sd, checkpoint_id=out)
        if rank == 0:
            torch.save(full, out + ".full.pt")
    elif mode == "big":
        sd = big_state(rank, world, float(sys.argv[3]))
        dcp.save(sd, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
