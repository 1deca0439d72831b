"""The engine's collectives over a torch.distributed process group (jobs launched by torchrun).

Metadata and replicated entries travel over gloo: a gloo group over the same ranks is made when
the group given is not gloo (nccl). The engine calls these methods from C++ (bindings.cc,
PyCommunicator); ranks are the group's own, translated to global ranks where torch wants them.

Every collective waits at most SHARDCKPT_COLLECTIVE_TIMEOUT_S seconds (default 1800, 0: forever),
as the MPI communicator does: a rank that never joins makes the others raise
:class:`shardckpt.DeadlineExceeded` instead of hanging. The group is then out of step (the
timed-out operation is still queued), so this communicator refuses every later call.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from .errors import DeadlineExceeded


def _timeout_s() -> float:
    try:
        value = float(os.environ.get("SHARDCKPT_COLLECTIVE_TIMEOUT_S", "1800"))
    except ValueError:
        return 1800.0
    return value if value >= 0 else 1800.0


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
        self.timeout_s = _timeout_s()
        self.broken = ""  # what timed out, once something did

    def _wait(self, work: Any, what: str) -> None:
        if self.broken:
            raise DeadlineExceeded("rank %d: torch.distributed %s refused: an earlier %s" % (
                self.rank, what, self.broken))
        if self.timeout_s <= 0:
            work.wait()
            return
        try:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as error:
            if "timed out" not in str(error).lower():
                raise
            self.broken = ("%s timed out after %g s (SHARDCKPT_COLLECTIVE_TIMEOUT_S) on rank %d "
                           "of a group of %d: another rank never joined it" % (
                               what, self.timeout_s, self.rank, self.size))
            raise DeadlineExceeded("torch.distributed " + self.broken) from None

    def barrier(self) -> None:
        self._wait(dist.barrier(group=self.group, async_op=True), "barrier")

    def broadcast(self, buffer: memoryview, root: int) -> None:
        if len(buffer) == 0:  # every rank passes the same length
            return
        # Through a tensor torch owns: one over Python-owned memory would be released (and the
        # Python object with it) on a gloo worker thread, which can end the process at exit.
        view = torch.frombuffer(buffer, dtype=torch.uint8)
        tensor = view.clone() if self.rank == root else torch.empty_like(view)
        self._wait(dist.broadcast(tensor, src=_global_rank(self.group, root), group=self.group,
                                  async_op=True), "broadcast")
        if self.rank != root:
            view.copy_(tensor)

    def allgather(self, mine: bytes) -> List[bytes]:
        length = torch.tensor([len(mine)], dtype=torch.int64)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._wait(dist.all_gather(lengths, length, group=self.group, async_op=True), "all_gather")
        longest = max(int(n) for n in lengths)
        if longest == 0:
            return [b""] * self.size
        padded = torch.zeros(longest, dtype=torch.uint8)
        if mine:
            padded[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)  # a copy
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]
        self._wait(dist.all_gather(parts, padded, group=self.group, async_op=True), "all_gather")
        return [parts[r][:int(lengths[r])].numpy().tobytes() for r in range(self.size)]

    def gather(self, mine: bytes, root: int) -> List[bytes]:
        everything = self.allgather(mine)  # metadata only: small, and one code path
        return everything if self.rank == root else []

    def allreduce_max_int64(self, values: List[int]) -> List[int]:
        tensor = torch.tensor(values, dtype=torch.int64)
        self._wait(dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True),
                   "all_reduce")
        return tensor.tolist()

    def allreduce_sum_double(self, values: List[float]) -> List[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        self._wait(dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
                   "all_reduce")
        return tensor.tolist()

    def duplicate(self) -> "TorchGroupComm":
        ranks = [_global_rank(self.group, r) for r in range(self.size)]
        return TorchGroupComm(dist.new_group(ranks=ranks, backend="gloo"))
