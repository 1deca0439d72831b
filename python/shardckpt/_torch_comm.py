"""The engine's collectives over a torch.distributed process group (jobs launched by torchrun).

Metadata and replicated entries travel over gloo: a gloo group over the same ranks is made when
the group given is not gloo (nccl). The engine calls these methods from C++ (bindings.cc,
PyCommunicator); ranks are the group's own, translated to global ranks where torch wants them.

Every collective waits at most SHARDCKPT_COLLECTIVE_TIMEOUT_S seconds (default 1800, 0: forever),
as the MPI communicator does: a rank that never joins makes the others raise
:class:`shardckpt.DeadlineExceeded`, naming it, instead of hanging. The group is then out of step (the
timed-out operation is still queued), so this communicator refuses every later call.
"""

from __future__ import annotations

import collections
import ctypes
import datetime
import hashlib
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .errors import Aborted, DeadlineExceeded, FailedPrecondition, Unimplemented


def _timeout_s() -> float:
    # The engine's reading (collectives/mpi_deadline.cc), so that both launchers take and refuse
    # the same values: a typo ("10s") is said and ignored, where it silently waited 30 minutes.
    from . import _core
    return float(_core.collective_timeout_s())


def _global_rank(group: Any, rank: int) -> int:
    if group is None or group == dist.group.WORLD:
        return rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)  # torch 1.13


def _connection_lost(text: str) -> bool:
    """Whether an error of gloo or the c10d store says its peer's connection went away."""
    return any(word in text for word in ("Connection reset", "Connection closed", "closed by peer",
                                         "Broken pipe", "Connection refused"))


def _first_line(text: str) -> str:
    """An error's first line, without gloo's or c10d's source path in brackets."""
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:300]


class _Census:
    """Who reached each collective, in the job's c10d store: a rank marks its arrival before
    the operation (the mark stays until its next one), so a rank whose collective timed out or
    failed can name those that never came.
    Without a store (or a torch that lacks the calls) the names are left out."""
    _made: Dict[Tuple[int, ...], int] = {}

    def __init__(self, ranks: List[int]) -> None:
        # Communicators over the same ranks are made in the same order on every rank.
        count = _Census._made.get(tuple(ranks), 0)
        _Census._made[tuple(ranks)] = count + 1
        digest = hashlib.sha1(repr(ranks).encode()).hexdigest()[:12]
        self.prefix = "shardckpt/census/%s/%d" % (digest, count)
        self.ranks = ranks
        self.sequence = 0
        try:
            self.store = dist.distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001 (no default store: no census)
            self.store = None

    def _key(self, rank: int, sequence: Optional[int] = None) -> str:
        return "%s/%d/%d" % (self.prefix, self.sequence if sequence is None else sequence, rank)

    # What each rank's key holds: which collective it reached, as a number (torch 1.13's stand-in
    # for check() adds 0 to the key, which must hold an integer), so that ranks that all arrived
    # but at different collectives (a save on some ranks, a load on others) are told apart.
    _KINDS = {"barrier": 2, "broadcast": 3, "all_gather": 4, "all_reduce": 5}

    def arrive(self, rank: int, what: str = "") -> None:
        # A rank's key stays after it leaves (a rank done with a collective is no absentee), and
        # goes when it reaches the next one: the store holds one key per rank.
        self.sequence += 1
        if self.store is not None:
            self.store.set(self._key(rank), str(self._KINDS.get(what, 1)).encode())
            if self.sequence > 1:
                self.store.delete_key(self._key(rank, self.sequence - 1))

    def gave_up(self, rank: int) -> None:
        """This rank reached the current collective and will reach no other (it failed or timed
        out): marked as at the next one too, so a peer that gets further and then fails does not
        name it as absent."""
        if self.store is not None:
            try:
                self.store.set(self._key(rank, self.sequence + 1), b"1")
            except Exception:  # noqa: BLE001 (the store is gone: nobody will be named anyway)
                pass

    def _there(self, key: str) -> bool:
        """Whether `key` is in the store; raises when the store itself cannot answer."""
        if hasattr(self.store, "check"):
            return bool(self.store.check([key]))
        # torch 1.13 has no check(). Not wait(): one that times out stays registered with the
        # server, whose late reply then stalls this client's next call. add(key, 0) answers at
        # once ("1" is 1, an absent key is made as 0 and removed again).
        if int(self.store.add(key, 0)) > 0:
            return True
        self.store.delete_key(key)
        return False

    def absent(self, me: Optional[int] = None) -> List[int]:
        """Ranks of the group (global numbering), other than `me` (an index in the group), that
        have not reached this collective: neither its key nor the next one's (a rank that went
        on) is there. Empty when the store cannot say (the rank that hosted it is gone)."""
        if self.store is None:
            return []
        missing = []
        for rank in range(len(self.ranks)):
            if rank == me:
                continue
            try:
                present = self._there(self._key(rank)) or self._there(self._key(rank, self.sequence + 1))
            except Exception:  # noqa: BLE001 (the store is gone with its host: nobody can be named)
                return []
            if not present:
                missing.append(self.ranks[rank])
        return missing

    def elsewhere(self, me: int, what: str) -> Dict[int, str]:
        """Ranks of the group (global numbering) that reached this collective's turn at another
        collective than `what`, with the one each reached; empty when the store cannot say."""
        if self.store is None:
            return {}
        names = {code: name for name, code in self._KINDS.items()}
        found: Dict[int, str] = {}
        for rank in range(len(self.ranks)):
            if rank == me:
                continue
            try:
                # One call that never waits: a get() of a key the peer deletes meanwhile (it went
                # on to its next collective) waited for the store's own timeout.
                code = int(self.store.add(self._key(rank), 0))
                if code == 0:
                    self.store.delete_key(self._key(rank))  # made by the add: it was not there
                    continue
                kind = names.get(code, "")
            except Exception:  # noqa: BLE001 (the store is gone with its host)
                return {}
            if kind and kind != what:
                found[self.ranks[rank]] = kind
        return found


# The last few collectives' Work handles (which hold their tensors). A gloo worker thread keeps
# its own reference to each Work for a moment after wait() returns; if it drops the last one, it
# frees Python tensors there and must take the GIL, and during interpreter shutdown that ends the
# thread through a forced unwind that aborts the process ("terminate called without an active
# exception", seen in about 1 of 20 torchrun jobs that saved and then exited without
# destroy_process_group). Held here, the last reference is dropped by a later collective or at
# module teardown, with the GIL held. Large buffers give their memory back at once (_release).
_RECENT_WORK: "collections.deque[Any]" = collections.deque(maxlen=8)


def _never_freed(*objects: Any) -> None:
    """Keeps ``objects`` until the process ends, past interpreter shutdown. A gloo group whose
    collective timed out still has it queued, and its destructor waits for it for torch's own
    timeout (30 minutes by default): a job that caught DeadlineExceeded and called
    destroy_process_group() hung at exit, in the hook that drops shardckpt's communicator, which
    then held the group's last reference. A reference nothing drops lets the process end; the
    group's threads end with it. (The collective's buffers stay allocated too: a job that goes on
    after the error keeps them.)"""
    _KEPT.extend(objects)  # where the interpreter has no C API to take a reference with
    try:
        incref = ctypes.pythonapi.Py_IncRef
    except AttributeError:
        return
    incref.argtypes = [ctypes.py_object]
    incref.restype = None
    for obj in objects:
        incref(obj)


_KEPT: List[Any] = []


def _group_gone(group: Any) -> bool:
    """Whether ``group`` was destroyed (with the default group, or on its own)."""
    if not dist.is_initialized():
        return True
    try:
        dist.get_world_size(group)
    except (ValueError, RuntimeError):
        return True
    return False


def _release(*tensors: torch.Tensor) -> None:
    """Frees the memory of tensors a finished collective's Work still holds (it keeps the tensor
    objects, now empty, alive in _RECENT_WORK)."""
    for t in tensors:
        t.set_()


def _gloo_group(ranks: List[int], instead: str, timeout_s: float = 0.0) -> Any:
    """A gloo group over ``ranks`` (global), made by those ranks alone. torch's new_group wants
    every rank of the world to make every group in one order; a subgroup's members making their
    own (pipeline stages each saving on its stage's group) took the group name another subgroup
    had, and joined its peers: a failed or hung connection. use_local_synchronization (torch
    >= 2.1) names the group from its ranks; without it only the whole world is safe."""
    import inspect
    # The engine's deadline; none (0) is 30 years, not torch's own default of 30 minutes, which
    # would fail a collective that the setting says may wait.
    timeout = {"timeout": datetime.timedelta(seconds=timeout_s if timeout_s > 0 else 30 * 365 * 86400)}
    if "use_local_synchronization" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=True, **timeout)
    if len(ranks) != dist.get_world_size():
        raise Unimplemented(
            "shardckpt needs a gloo group of its own over ranks %s of a torch.distributed subgroup, "
            "which its ranks alone can make only with torch >= 2.1 (new_group's "
            "use_local_synchronization; this is torch %s): %s" % (ranks, torch.__version__, instead))
    return dist.new_group(ranks=ranks, backend="gloo", **timeout)


class TorchGroupComm:
    """Collectives for the engine over ``group`` (the default group when None)."""

    def __init__(self, group: Optional[Any] = None) -> None:
        group = dist.group.WORLD if group is None else group
        ranks = [_global_rank(group, r) for r in range(dist.get_world_size(group))]
        self.timeout_s = _timeout_s()
        if dist.get_backend(group) != "gloo":
            group = _gloo_group(ranks, "make the subgroup with backend='gloo', or use the default group",
                                self.timeout_s)
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.broken = ""  # what timed out, once something did
        self.failed = ""  # what failed otherwise (a rank lost), once something did
        self.census = _Census(ranks)

    def _run(self, what: str, launch: Callable[[], Any]) -> None:
        """Launches one collective (async) and waits for it, at most timeout_s."""
        if self.broken:
            raise DeadlineExceeded("rank %d: torch.distributed %s refused: an earlier %s" % (
                _global_rank(self.group, self.rank), what, self.broken))
        if self.failed:
            # Not tried again on a group that lost a rank (and not counted in the census: the
            # others name the ranks missing from the collective that failed, which this one left).
            raise Aborted("rank %d: torch.distributed %s refused: an earlier %s" % (
                _global_rank(self.group, self.rank), what, self.failed))
        if _group_gone(self.group):
            # A save in flight (async) when the job called destroy_process_group(): torch's own
            # error ("Group ... is not registered") says nothing of why.
            raise FailedPrecondition(
                "rank %d: torch.distributed %s: the process group was destroyed while shardckpt "
                "still needed it (an async save in flight?): call the save handle's wait() "
                "before dist.destroy_process_group()" % (self.rank, what))
        try:
            self.census.arrive(self.rank, what)
        except Exception as error:  # noqa: BLE001 - any store failure ends this communicator
            # The store's host died (rank 0 killed under an env:// launch): torch's own
            # "DistNetworkError: Broken pipe" came out under the collective's name, with no rank.
            text = str(error)
            where = ("%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
                     if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ else "")
            host_gone = _connection_lost(text) or isinstance(error, ConnectionError)
            self.failed = ("%s failed: the job's c10d store%s did not answer [%s: %s]%s"
                           % (what, " at " + where if where else "", type(error).__name__, _first_line(text),
                              ": the process that hosts it (rank 0 of the job where it was started with "
                              "env://, as srun does; torchrun's agent under torchrun) died or exited; its "
                              "own output says why" if host_gone else ""))
            raise Aborted("rank %d: torch.distributed %s" % (_global_rank(self.group, self.rank), self.failed)) from None
        started = time.monotonic()
        work = launch()
        _RECENT_WORK.append(work)
        try:
            if self.timeout_s <= 0:
                work.wait()
                return
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as error:
            if self.timeout_s <= 0 or "timed out" not in str(error).lower():
                raise self._failed(what, str(error)) from None
            _never_freed(self.group, work)
            self.census.gave_up(self.rank)
            absent = self.census.absent(self.rank)
            elsewhere = {} if absent else self.census.elsewhere(self.rank, what)
            if absent:
                who = "rank%s %s never joined it" % ("s" if len(absent) > 1 else "", ", ".join(map(str, absent)))
            elif elsewhere:
                who = ("every rank reached this turn, but %s: the ranks are in different calls (a save on "
                       "some ranks, a load on others?)" % ", ".join("rank %d is in %s" % (r, kind)
                                                                   for r, kind in sorted(elsewhere.items())))
            else:
                who = "another rank never joined it"
            # The group's own timeout (init_process_group(timeout=...)) may come first: the time
            # waited is said, and which deadline it was.
            waited = time.monotonic() - started
            deadline = ("SHARDCKPT_COLLECTIVE_TIMEOUT_S" if waited >= 0.9 * self.timeout_s else
                        "the process group's own timeout, before SHARDCKPT_COLLECTIVE_TIMEOUT_S=%g s"
                        % self.timeout_s)
            self.broken = ("%s timed out after %g s (%s) on rank %d of a group of %d: %s"
                           % (what, round(waited, 1), deadline, _global_rank(self.group, self.rank), self.size, who))
            raise DeadlineExceeded("torch.distributed " + self.broken) from None

    def _failed(self, what: str, text: str) -> Aborted:
        """A collective that failed other than by the deadline: gloo's "Connection reset by
        peer" when a rank died mid-collective. Its first line, without gloo's source path, and
        the ranks that never joined, which are the likely dead."""
        first = _first_line(text)
        lost = _connection_lost(text)
        who = ""
        self.census.gave_up(self.rank)
        if lost:
            absent = self.census.absent(self.rank)
            # A live rank may not have reached the collective yet when a dead one's connection
            # closed it here: given a moment (a dead rank never comes), it is not named. One
            # slower than that still is, so the words claim no more than was seen.
            settle = time.monotonic() + min(1.0, self.timeout_s if self.timeout_s > 0 else 1.0)
            while absent and time.monotonic() < settle:
                time.sleep(0.1)
                absent = self.census.absent(self.rank)
            who = (": rank%s %s of the group had not reached it a second later (a rank that died or exited "
                   "closed its connection; its own output says why)"
                   % ("s" if len(absent) > 1 else "", ", ".join(map(str, absent))) if absent else
                   ": a rank of the group closed its connection (died or exited? its own output says why)")
        self.failed = "%s failed%s [%s]" % (what, who, first)
        return Aborted("rank %d: torch.distributed %s" % (_global_rank(self.group, self.rank), self.failed))

    def barrier(self) -> None:
        self._run("barrier", lambda: dist.barrier(group=self.group, async_op=True))

    def broadcast(self, buffer: memoryview, root: int) -> None:
        if len(buffer) == 0:  # every rank passes the same length
            return
        # Through a tensor torch owns: one over Python-owned memory would be released (and the
        # Python object with it) on a gloo worker thread, which can end the process at exit.
        view = torch.frombuffer(buffer, dtype=torch.uint8)
        tensor = view.clone() if self.rank == root else torch.empty_like(view)
        source = _global_rank(self.group, root)
        self._run("broadcast", lambda: dist.broadcast(tensor, src=source, group=self.group,
                                                      async_op=True))
        if self.rank != root:
            view.copy_(tensor)
        _release(tensor)

    def allgather(self, mine: bytes) -> List[bytes]:
        length = torch.tensor([len(mine)], dtype=torch.int64)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._run("all_gather", lambda: dist.all_gather(lengths, length, group=self.group,
                                                        async_op=True))
        longest = max(int(n) for n in lengths)
        if longest == 0:
            return [b""] * self.size
        padded = torch.zeros(longest, dtype=torch.uint8)
        if mine:
            padded[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)  # a copy
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]
        self._run("all_gather", lambda: dist.all_gather(parts, padded, group=self.group,
                                                        async_op=True))
        gathered = [parts[r][:int(lengths[r])].numpy().tobytes() for r in range(self.size)]
        _release(padded, *parts)
        return gathered

    def gather(self, mine: bytes, root: int) -> List[bytes]:
        everything = self.allgather(mine)  # metadata only: small, and one code path
        return everything if self.rank == root else []

    def _allreduce(self, buffer: memoryview, dtype: torch.dtype, op: Any) -> None:
        # In place in the engine's memory (lists each way took 0.8-1.7 ms of Python alone at the
        # 40,000 values of a 20,000-tensor load's coverage check; this 0.1-0.3 ms), through a
        # tensor torch owns, as broadcast() does.
        if len(buffer) == 0:  # every rank passes the same length
            return
        view = torch.frombuffer(buffer, dtype=dtype)
        tensor = view.clone()
        self._run("all_reduce", lambda: dist.all_reduce(tensor, op=op, group=self.group, async_op=True))
        view.copy_(tensor)
        _release(tensor)

    def allreduce_max_int64(self, buffer: memoryview) -> None:
        self._allreduce(buffer, torch.int64, dist.ReduceOp.MAX)

    def allreduce_sum_double(self, buffer: memoryview) -> None:
        self._allreduce(buffer, torch.float64, dist.ReduceOp.SUM)

    def duplicate(self) -> "TorchGroupComm":
        # The ranks meet first, within SHARDCKPT_COLLECTIVE_TIMEOUT_S, so that one that never
        # calls async_save() is named as for any collective: new_group's own rendezvous waited
        # for it for torch's timeout (30 minutes by default), past the documented deadline.
        self.barrier()
        ranks = [_global_rank(self.group, r) for r in range(self.size)]
        return TorchGroupComm(_gloo_group(ranks, "use save() on the subgroup, or async_save() on the default group",
                                          self.timeout_s))
