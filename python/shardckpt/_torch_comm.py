"""The engine's collectives over a torch.distributed process group (jobs launched by torchrun).

Metadata and replicated entries travel over gloo: a gloo group over the same ranks is made when
the group given is not gloo (nccl). The engine calls these methods from C++ (bindings.cc,
PyCommunicator); ranks are the group's own, translated to global ranks where torch wants them.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist


def _global_rank(group: Any, rank: int) -> int:
    if group is None or group == dist.group.WORLD:
        return rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)  # torch 1.13


class TorchGroupComm:
    """Collectives for the engine over ``group`` (the default group when None)."""

    def __init__(self, group: Optional[Any] = None) -> None:
        group = dist.group.WORLD if group is None else group
        if dist.get_backend(group) != "gloo":
            ranks = [_global_rank(group, r) for r in range(dist.get_world_size(group))]
            group = dist.new_group(ranks=ranks, backend="gloo")  # collective, as this call is
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def broadcast(self, buffer: memoryview, root: int) -> None:
        if len(buffer) == 0:  # every rank passes the same length
            return
        # Through a tensor torch owns: one over Python-owned memory would be released (and the
        # Python object with it) on a gloo worker thread, which can end the process at exit.
        view = torch.frombuffer(buffer, dtype=torch.uint8)
        tensor = view.clone() if self.rank == root else torch.empty_like(view)
        dist.broadcast(tensor, src=_global_rank(self.group, root), group=self.group)
        if self.rank != root:
            view.copy_(tensor)

    def allgather(self, mine: bytes) -> List[bytes]:
        length = torch.tensor([len(mine)], dtype=torch.int64)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(lengths, length, group=self.group)
        longest = max(int(n) for n in lengths)
        if longest == 0:
            return [b""] * self.size
        padded = torch.zeros(longest, dtype=torch.uint8)
        if mine:
            padded[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)  # a copy
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(parts, padded, group=self.group)
        return [parts[r][:int(lengths[r])].numpy().tobytes() for r in range(self.size)]

    def gather(self, mine: bytes, root: int) -> List[bytes]:
        everything = self.allgather(mine)  # metadata only: small, and one code path
        return everything if self.rank == root else []

    def allreduce_max_int64(self, values: List[int]) -> List[int]:
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return tensor.tolist()

    def allreduce_sum_double(self, values: List[float]) -> List[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor.tolist()

    def duplicate(self) -> "TorchGroupComm":
        ranks = [_global_rank(self.group, r) for r in range(self.size)]
        return TorchGroupComm(dist.new_group(ranks=ranks, backend="gloo"))
