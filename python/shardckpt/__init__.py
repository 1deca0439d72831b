"""shardckpt from Python: collective, sharded checkpoints of PyTorch state dicts.

::

    import shardckpt
    sd = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
          "rng": shardckpt.PerRank(torch.get_rng_state())}
    shardckpt.save(sd, "/ckpt/run1", step=step, keep_last=3)   # every rank calls it
    report = shardckpt.load(sd, "/ckpt/run1")                   # in place, at any world size

Under ``mpirun`` every rank of MPI_COMM_WORLD takes part; under ``torchrun`` (once
torch.distributed is initialized) its default group, over gloo; with no launcher, one process;
``comm=`` takes a process group or an mpi4py communicator too.
A state dict may hold, nested in dicts, lists and tuples: tensors (replicated: each rank holds
the whole tensor, written once), DTensors with ``Shard(d)``/``Replicate()`` placements on meshes
of any number of dims (FSDP2, TP, HSDP; saved from and loaded into their local tensors, at any
world size and placement), :class:`FlatShard` (a rank's flat range, FSDP1/ZeRO),
:class:`PerRank` values, and int/float/str/bool/None/bytes with lists, tuples and dicts of them
(stored as typed JSON or raw bytes, never pickled). Anything else is refused, naming its key.
Errors are :class:`ShardckptError` subclasses, the same on every rank.

FSDP2 model and optimizer, at any world size::

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, optim)
    shardckpt.save({"model": model_sd, "optim": optim_sd}, "/ckpt/run1", step=step)
    ...
    model_sd, optim_sd = get_state_dict(model, optim)   # targets (optimizer state created)
    shardckpt.load({"model": model_sd, "optim": optim_sd}, "/ckpt/run1")
    set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)

The extension links no libtorch: one build serves torch 1.13 and 2.x.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import numbers
import os
import signal
import sys
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from ._dtensor import dtensor_piece, is_dtensor
from ._comm import (forget_foreign, from_mpi4py, from_process_group, launched_by_mpi, resolve,
                    single_process, world)
from ._state import (DTYPES, FlatShard, PerRank, check_unicode, dcp_leaf_names, dcp_leaves, dcp_stores_nothing_of,
                     decode_blob, dtype_name, encode_blob, host_values, param_groups_differ, regroup, restore, walk)
from .errors import (Aborted, AlreadyExists, DataLoss, DeadlineExceeded, FailedPrecondition,
                     Internal, InvalidArgument, IoError, NoSpace, NotFound, ShardckptError,
                     Unimplemented, raise_for)
from ._preemption import PreemptionWatcher, StopRequest

__all__ = [
    "save", "load", "async_save", "AsyncSaveHandle", "inspect", "verify", "VerifyReport",
    "VerifyProblem", "consolidate", "import_checkpoint", "reshard", "SaveResult", "LoadReport",
    "FlatShard", "PerRank", "world", "from_process_group", "from_mpi4py",
    "single_process", "launched_by_mpi", "ShardckptError", "InvalidArgument", "NotFound",
    "AlreadyExists", "DataLoss", "IoError", "NoSpace", "FailedPrecondition", "Unimplemented",
    "Internal", "Aborted", "DeadlineExceeded", "release_staging", "PreemptionWatcher", "StopRequest",
]
__version__ = "0.1.0"


@dataclasses.dataclass
class SaveResult:
    """What :func:`save` did: the committed folder and the bytes written."""
    path: str
    bytes_written: int  # by this rank: data, padding and checksum table
    total_bytes: int    # by every rank
    # The state's description (names, dtypes, shapes, layouts, value sizes) had not changed on
    # any rank since the previous save on this communicator: its plan was reused, no gather.
    plan_reused: bool = False
    # Seconds this rank spent in each phase, in order: plan, write, gather_reports, then on
    # rank 0 build_manifest and commit (validate, encode, write and publish the manifest, apply
    # retention), and share_outcome (elsewhere: waiting for the commit).
    phases: Dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LoadReport:
    """What :func:`load` did. ``missing``: names of the state dict not in the checkpoint;
    ``unexpected``: checkpoint names nothing loaded (both empty after a strict load);
    ``unavailable``: PerRank values not restored, with the reason (another world size)."""
    path: str
    step: int
    saved_world_size: int
    missing: List[str]
    unexpected: List[str]
    unavailable: Dict[str, str]
    bytes_read: int      # data bytes this rank read from storage
    bytes_wanted: int    # bytes this rank needed from storage
    bytes_received: int  # replicated bytes received from other ranks
    # Seconds this rank spent in each phase, in order: read_manifest (rank 0), share_manifest,
    # match, plan, read, replicated.
    phases: Dict[str, float] = dataclasses.field(default_factory=dict)
    bytes_read_ahead: int = 0  # of bytes_read, read during the metadata phases (its own file)
    every_rank_parsed_manifest: bool = False  # rather than receiving rank 0's decoded copy
    # Tensors whose parts, over every rank, leave elements out: elements no rank loaded (a strict
    # load refuses them; a rank that left the name out, or two ranks that loaded the same part).
    loaded_in_part: List[str] = dataclasses.field(default_factory=list)


PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


def _fs(path: PathLike) -> bytes:
    """A path as the engine takes it: its bytes, so a name that is not UTF-8 (``os.fsdecode``'s
    surrogates, or bytes) reaches the file system as it is. Paths come back as ``os.fsdecode``
    would give them."""
    return os.fsencode(path)


def _piece(name: str, tensor: torch.Tensor, shape: List[int], layout: Tuple[str, Any, Any]) -> tuple:
    return (name, dtype_name(tensor, name), shape, layout[0], layout[1], layout[2],
            tensor.data_ptr())


def _check_dense(tensor: torch.Tensor, name: str, verb: str) -> None:
    """Refuses, naming the key, what holds no strided bytes to save or load into: a meta
    tensor (FSDP2's meta-device init before ``to_empty``; a load into one copied into nothing
    and reported success) and a sparse or otherwise non-strided one."""
    if tensor.device.type == "meta":
        raise InvalidArgument("'%s' is a meta tensor, which holds no memory to %s: materialize it first "
                              "(e.g. model.to_empty(device=...))" % (name, verb))
    if tensor.layout != torch.strided:
        raise InvalidArgument("'%s' has layout %s: shardckpt %ss dense (strided) tensors; convert it "
                              "(e.g. .to_dense()) first" % (name, tensor.layout, verb))


def _overlaps_itself(tensor: torch.Tensor) -> bool:
    """Whether two of ``tensor``'s elements share memory (a view made by ``as_strided`` or
    ``unfold`` whose windows overlap; an expanded view, stride 0, is refused before this).

    Dims sorted by stride: the largest is dropped while its stride is past the reach of all the
    smaller ones (its slices cannot meet), which settles transposes, slices and permutations at
    once. Of what is left, more elements than the memory positions they span (every overlapping
    unfold) is an overlap; anything else has its positions marked on a bitmap a block at a time
    (a byte per position spanned, up to 2^28), or, spanning more, its offsets counted (up to
    2^24 elements; a larger view is loaded as torch's copy_ would)."""
    if tensor.numel() == 0:
        return False
    dims = sorted((abs(st), n) for st, n in zip(tensor.stride(), tensor.shape) if n > 1)
    while dims and dims[-1][0] > sum(stride * (size - 1) for stride, size in dims[:-1]):
        dims.pop()
    if not dims:
        return False
    numel = math.prod(size for _, size in dims)
    span = sum(stride * (size - 1) for stride, size in dims) + 1
    if numel > span:
        return True

    def offsets(of: List[Tuple[int, int]]) -> torch.Tensor:
        out = torch.zeros(1, dtype=torch.int64)
        for stride, size in of:
            out = (out.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride).reshape(-1)
        return out

    if span > 1 << 28:
        return numel <= 1 << 24 and torch.unique(offsets(dims)).numel() < numel
    # Blocks along the largest dim; within a block, the offsets of the others.
    outer = max(range(len(dims)), key=lambda d: dims[d][1])
    inner = offsets(dims[:outer] + dims[outer + 1:])
    hit = torch.zeros(span, dtype=torch.bool)
    rows = max(1, (1 << 22) // inner.numel())
    stride, size = dims[outer]
    for first in range(0, size, rows):
        at = torch.arange(first, min(size, first + rows), dtype=torch.int64) * stride
        hit[(at.unsqueeze(-1) + inner).reshape(-1)] = True
    return int(hit.count_nonzero()) < numel


def _utf8_safe(message: str) -> str:
    """``message`` with anything that is not valid Unicode escaped: a lone surrogate failed the
    call into the engine on this rank alone."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def _refusal(failure: BaseException) -> Tuple[str, str]:
    """(code, message) of a failure on this rank that every rank must be told of. Not only
    ShardckptError: an error of Python's or torch's (RecursionError, a failed conversion) raised
    here alone left the other ranks waiting in the engine's next collective until its timeout.
    The message made UTF-8 safe (a lone surrogate in it failed the call into the engine)."""
    if isinstance(failure, ShardckptError):
        code, message = failure.code, failure.message
    else:
        code, message = "InvalidArgument", "%s: %s" % (type(failure).__name__, failure)
    return code, _utf8_safe(message)


def _named(name: str, describe: Callable[[], Any]) -> Any:
    """describe(), with an error of torch or Python's (not a ShardckptError) turned into an
    InvalidArgument naming the key, so that it is agreed on by every rank like the others."""
    try:
        return describe()
    except ShardckptError:
        raise
    except Exception as e:  # noqa: BLE001 (any error here is the state's, reported by name)
        raise InvalidArgument("'%s': %s: %s" % (name, type(e).__name__, e)) from e


def _save_view(tensor: torch.Tensor, name: str, keep: List[torch.Tensor]) -> torch.Tensor:
    """A contiguous host tensor with the values of ``tensor`` (itself when it is one)."""
    _check_dense(tensor, name, "save")
    view = host_values(tensor)
    keep.append(view)  # alive until the engine has written it
    return view


def _describe_save(state: Mapping[str, Any], keep: List[torch.Tensor]) -> Tuple[list, list, str]:
    """The pieces and blobs to save, and where the nested ones sat (JSON, "" when none is)."""
    pieces, blobs, paths = [], [], {}  # type: ignore[var-annotated]
    for name, value in walk(state, paths=paths):
        _named(name, lambda: _describe_save_item(name, value, keep, pieces, blobs))
    return pieces, blobs, json.dumps(paths, separators=(",", ":")) if paths else ""


def _describe_save_item(name: str, value: Any, keep: List[torch.Tensor], pieces: list, blobs: list) -> None:
    if isinstance(value, FlatShard):
        local = _save_view(value.local, name, keep)
        begin = value.begin
        pieces.append(_piece(name, local, value.global_shape,
                             ("flat", begin, begin + local.numel())))
    elif is_dtensor(value):
        local, global_shape, layout = dtensor_piece(name, value)
        pieces.append(_piece(name, _save_view(local, name, keep), global_shape, layout))
    elif isinstance(value, torch.Tensor):
        view = _save_view(value, name, keep)
        pieces.append(_piece(name, view, list(view.shape), ("replicated", None, None)))
    elif isinstance(value, PerRank):
        blobs.append((name, encode_blob(value.value, name), True))
    else:
        blobs.append((name, encode_blob(value, name), False))


def _describe_for_collective(state: Mapping[str, Any], step: Any,
                             keep: List[torch.Tensor]) -> Tuple[int, list, list, str, Tuple[str, str]]:
    """The step and _describe_save, with a refusal returned as (code, message) instead of
    raised: the engine tells it to every rank, so a rank whose state is refused does not leave
    the others waiting."""
    try:
        if isinstance(step, torch.Tensor) and step.numel() == 1 and float(step.item()).is_integer():
            step = int(step.item())  # an optimizer's state["step"], a tensor in torch 2.x
    except Exception:  # noqa: BLE001 - a complex or meta tensor: refused below, on every rank
        pass
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        return 0, [], [], "", ("InvalidArgument", "step must be a whole number, not %r" % (step,))
    if not -2 ** 63 <= int(step) < 2 ** 63:  # the engine's int64 (pybind's TypeError said less)
        return 0, [], [], "", ("InvalidArgument", "step %d is out of range (a 64-bit step)" % int(step))
    try:
        pieces, blobs, paths = _describe_save(state, keep)
        return int(step), pieces, blobs, paths, ("OK", "")
    except Exception as failure:  # noqa: BLE001 - told to every rank (_refusal)
        return int(step), [], [], "", _refusal(failure)


def _user_metadata(user_metadata: Optional[Mapping[str, str]]) -> Tuple[Dict[str, str], Tuple[str, str]]:
    """The manifest's user metadata (str to str), or {} and the refusal as (code, message), which
    the engine tells every rank, as _describe_for_collective's."""
    try:
        try:
            items = dict(user_metadata or {})
        except Exception as error:  # noqa: BLE001 - a list, a tensor's truth value
            raise InvalidArgument("user_metadata must be a mapping of str to str: %s: %s"
                                  % (type(error).__name__, error)) from None
        for key, value in items.items():
            if not isinstance(key, str):
                raise InvalidArgument("user_metadata keys are str, not %s (%r)" % (type(key).__name__, key))
            check_unicode(key, lambda: "a user_metadata key")
            if not isinstance(value, str):
                raise InvalidArgument("user_metadata['%s'] is %s (%r); its values are str, stored as given: pass "
                                      "str(...), or save the value in the state dict" % (key, type(value).__name__, value))
            check_unicode(value, lambda: "user_metadata[%a]" % key)
    except ShardckptError as failure:  # this rank's argument, told to every rank
        return {}, _refusal(failure)
    return items, ("OK", "")


def _metrics(metrics: Optional[Mapping[str, float]]) -> Tuple[Dict[str, float], Tuple[str, str]]:
    """The metrics to record (str to float), or {} and the refusal as (code, message), which
    the engine tells every rank, as _user_metadata's."""
    out: Dict[str, float] = {}
    try:
        items = dict({} if metrics is None else metrics).items()
    except Exception as error:  # noqa: BLE001 - a tensor's truth value, a list: told to every rank
        return {}, ("InvalidArgument", "metrics must be a mapping of names to numbers: %s: %s"
                    % (type(error).__name__, error))
    for key, value in items:
        if not isinstance(key, str):
            return {}, ("InvalidArgument", "metrics keys are str, not %s (%r)" % (type(key).__name__, key))
        try:
            check_unicode(key, lambda: "a metrics key")
        except ShardckptError as failure:
            return {}, _refusal(failure)
        refusal = ("InvalidArgument", "metrics['%s'] is %s (%r); metrics are numbers" % (key, type(value).__name__, value))
        if isinstance(value, (bool, str, bytes)) or getattr(value, "dtype", None) in (torch.bool, bool):
            return {}, refusal
        try:
            # A loss tensor, a numpy scalar or 0-d array, a Decimal: whatever float() takes.
            out[key] = float(value.item() if hasattr(value, "item") else value)
        except Exception:  # noqa: BLE001 - any failure here is this rank's metric, agreed on by every rank
            return {}, refusal
    return out, ("OK", "")


def _path_arg(path: Any, what: str) -> Tuple[bytes, Tuple[str, str]]:
    """_fs(path), or b"" and the refusal (None, a number): raised on one rank alone it left the
    others waiting in the engine's first collective."""
    try:
        return _fs(path), ("OK", "")
    except Exception as error:  # noqa: BLE001 - this rank's argument, told to every rank
        return b"", ("InvalidArgument", "%s must be a path (str, bytes or os.PathLike), not %s"
                     % (what, type(path).__name__))


class _Retention(NamedTuple):
    keep_last: int = 0
    keep_best: int = 0
    best_metric: str = ""
    best_higher_is_better: bool = False


def _retention(keep_last: Any, keep_best: Any, best_metric: Any,
               best_higher_is_better: Any) -> Tuple[_Retention, Tuple[str, str]]:
    """The save's retention rule as the engine takes it, or the defaults and the refusal."""
    try:
        if not isinstance(best_metric, str):
            raise InvalidArgument("best_metric must be a str, not %s" % type(best_metric).__name__)
        check_unicode(best_metric, lambda: "best_metric")
        rule = _Retention(int(keep_last), int(keep_best), best_metric, bool(best_higher_is_better))
        for what, count in (("keep_last", rule.keep_last), ("keep_best", rule.keep_best)):
            if not 0 <= count < 2 ** 31:  # the engine's int (a larger one failed the binding alone)
                raise InvalidArgument("%s=%d: a count of checkpoints, 0 (keep all) to 2**31 - 1" % (what, count))
        return rule, ("OK", "")
    except Exception as failure:  # noqa: BLE001 - this rank's arguments, told to every rank
        return _Retention(), _refusal(failure)


class _SaveCall(NamedTuple):
    step: int
    pieces: list
    blobs: list
    user_metadata: Dict[str, str]
    state_paths: str  # JSON: where the nested leaves sat, for a consolidated .pt's nesting
    metrics: Dict[str, float]
    retention: _Retention
    root: bytes
    error: Tuple[str, str]  # the first refusal among them, ("OK", "") when none


def _describe_save_call(state: Mapping[str, Any], step: Any, metrics: Optional[Mapping[str, float]],
                        user_metadata: Optional[Mapping[str, str]], keep: List[torch.Tensor],
                        root: Any, retention: Tuple[Any, Any, Any, Any]) -> _SaveCall:
    """What save and async_save hand the engine: the state, the user metadata, the metrics, the
    retention rule and the root, with the first refusal among them, which the engine tells
    every rank."""
    step, pieces, blobs, paths, error = _describe_for_collective(state, step, keep)
    metadata, metadata_error = _user_metadata(user_metadata)
    recorded, metrics_error = _metrics(metrics)
    rule, rule_error = _retention(*retention)
    root_bytes, root_error = _path_arg(root, "root")
    for refusal in (metadata_error, metrics_error, rule_error, root_error):
        if error[0] == "OK":
            error = refusal
    return _SaveCall(step, pieces, blobs, metadata, paths, recorded, rule, root_bytes, (error[0], _utf8_safe(error[1])))


def save(state_dict: Mapping[str, Any], root: PathLike, step: int, *, keep_last: int = 0,
         keep_best: int = 0, best_metric: str = "", best_higher_is_better: bool = False,
         metrics: Optional[Mapping[str, float]] = None,
         user_metadata: Optional[Mapping[str, str]] = None, comm: Any = None) -> SaveResult:
    """Saves ``state_dict`` as checkpoint ``step`` under ``root`` (collective: every rank calls
    it with its own state, and every rank returns or raises the same).

    The checkpoint is committed atomically as ``root/step-N`` and ``root/latest`` names it.
    ``keep_last``/``keep_best`` (by ``best_metric`` among ``metrics``) prune older checkpoints;
    0 keeps all. ``comm``: a communicator from :func:`world`, :func:`single_process`,
    :func:`from_process_group` or :func:`from_mpi4py`, a torch.distributed process group or an
    mpi4py communicator; the default is :func:`world` (MPI_COMM_WORLD under mpirun, the default
    process group under torchrun). Tensors may be non-contiguous or on a GPU (copied to host
    first). A DTensor is saved from its local tensor as the box of the global tensor its
    placements give this rank; replicas (``Replicate()`` mesh dims) are written once. A
    ``Partial`` placement raises :class:`Unimplemented` naming the key.
    """
    from . import _core
    comm = resolve(comm)
    # This job's async saves in flight go first, as a second async_save waits for the first:
    # otherwise one of the two saves found the root locked by the other and failed.
    _wait_for_savers_of(comm)
    keep: List[torch.Tensor] = []
    call = _describe_save_call(state_dict, step, metrics, user_metadata, keep, root,
                               (keep_last, keep_best, best_metric, best_higher_is_better))
    with _ctrl_c_after_the_save() as caught:
        code, message, result = _core.save(
            comm, call.root, call.step, call.pieces, call.blobs, *call.retention, call.metrics, call.user_metadata,
            call.state_paths, torch.__version__, call.error)
    if caught:  # said whether the save failed or not: a loop that retries failed saves must stop
        try:
            raise_for(code, message)
        except ShardckptError as failure:
            raise KeyboardInterrupt("Ctrl-C during the save of step %d, which failed: %s" % (call.step, failure)) \
                from failure
        raise KeyboardInterrupt("Ctrl-C during the save of step %d, which committed" % call.step)
    raise_for(code, message)
    return SaveResult(**result)


@contextlib.contextmanager
def _ctrl_c_after_the_save() -> Iterator[List[int]]:
    """Holds Ctrl-C (SIGINT) until the save's engine call returns; the list it yields says
    whether one came. A save is collective: one rank cannot leave it alone. Under mpirun the
    engine runs without Python and the signal waited anyway; under torchrun its collectives are
    Python's (gloo), where KeyboardInterrupt left the save on that rank, the others blocked in
    it until that process exited, and nothing committed. A second Ctrl-C acts at once, as a
    program's own SIGINT handler does (it is left alone), and a thread other than the main one
    cannot hold signals."""
    caught: List[int] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is not signal.default_int_handler:
        yield caught
        return

    def hold(signum: int, frame: Any) -> None:
        if caught:
            signal.default_int_handler(signum, frame)
        caught.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


def _describe_load(state: Mapping[str, Any]) -> Tuple[list, Dict[str, Any], list]:
    """Pieces to load into, the blobs wanted (name -> current value), and the copies to make
    afterwards (target, temporary) for targets the engine cannot write in place."""
    pieces, wanted_blobs, copies = [], {}, []
    temporaries: Dict[tuple, torch.Tensor] = {}
    for name, value in walk(state):
        _named(name, lambda: _describe_load_item(name, value, pieces, wanted_blobs, copies, temporaries))
    return pieces, wanted_blobs, copies


def _view_key(t: torch.Tensor) -> tuple:
    """What makes two tensors one (tied parameters on a GPU): the same first element and view."""
    return (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)


def _describe_load_item(name: str, value: Any, pieces: list, wanted_blobs: Dict[str, Any], copies: list,
                        temporaries: Dict[tuple, torch.Tensor]) -> None:
    # A module or an optimizer (DCP's Stateful habit) was taken for a value to replace: the load
    # then said "holds no tensors" and, with strict=False, left the weights as they were.
    if isinstance(value, torch.nn.Module):
        raise InvalidArgument("'%s' is a %s.%s: load into its state_dict() (its tensors are the module's own, "
                              "filled in place)" % (name, type(value).__module__, type(value).__qualname__))
    if isinstance(value, torch.optim.Optimizer):
        raise InvalidArgument("'%s' is a %s.%s: load into its state_dict() (or DCP's get_state_dict(model, "
                              "optim)), then hand that to its load_state_dict()"
                              % (name, type(value).__module__, type(value).__qualname__))
    if isinstance(value, (torch.Tensor, FlatShard)):
        target = value.local if isinstance(value, FlatShard) else value
        layout = None
        if is_dtensor(value):
            target, global_shape, layout = dtensor_piece(name, value)
        _check_dense(target, name, "load")
        if target.numel() > 1 and any(st == 0 and n > 1 for st, n in zip(target.stride(), target.shape)):
            # Refused before reading, on every rank, by name: the copy back raised torch's own
            # "more than one element of the written-to tensor refers to a single memory location".
            raise InvalidArgument("'%s' is an expanded view (stride 0): its elements share memory, so it "
                                  "cannot take the loaded values; load into a tensor of its own (.clone())" % name)
        if not target.is_contiguous() and _overlaps_itself(target):
            raise InvalidArgument("'%s' is a view whose elements overlap in memory (shape %s, strides %s), so it "
                                  "cannot take the loaded values; load into a tensor of its own (.clone())"
                                  % (name, list(target.shape), list(target.stride())))
        into = target
        if target.device.type != "cpu" or not target.is_contiguous() or target.is_neg() or target.is_conj():
            # One temporary per tensor, however many names it has: the engine then sees tied
            # targets as the one memory they are and compares what the checkpoint gives each.
            key = _view_key(target)
            if key in temporaries:
                into = temporaries[key]
            else:
                into = temporaries[key] = torch.empty(target.shape, dtype=target.dtype)
                copies.append((target, into))
        if layout is not None:
            pieces.append(_piece(name, into, global_shape, layout))
        elif isinstance(value, FlatShard):
            pieces.append(_piece(name, into, value.global_shape,
                                 ("flat", value.begin, value.begin + into.numel())))
        else:
            pieces.append(_piece(name, into, list(into.shape), ("replicated", None, None)))
    else:
        wanted_blobs[name] = value


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix):] if prefix and name.startswith(prefix) else name


def _strict_refusal(path: str, missing: List[str], unexpected: List[str]) -> ShardckptError:
    # The engine's wording (load_phases.cc MatchVerdict), for the cases only rebuilding finds.
    quoted = lambda names: ", ".join("'%s'" % n for n in names)  # noqa: E731
    parts = []
    if missing:
        parts.append("not in checkpoint %s: %s" % (path, quoted(missing)))
    if unexpected:
        parts.append("checkpoint %s has entries no rank loads: %s" % (path, quoted(unexpected)))
    return (NotFound if missing else InvalidArgument)("; ".join(parts) + " (strict=False loads the rest "
                                                      "and reports them)")


def load(state_dict: Dict[str, Any], path: PathLike, *, strict: bool = True, strip_prefix: str = "",
         verify_checksums: bool = True, comm: Any = None, replicated_reads: str = "auto",
         manifest_sharing: str = "auto", read_ahead_max_bytes: Optional[int] = None) -> LoadReport:
    """Loads a checkpoint into ``state_dict`` in place (collective).

    ``path`` is a checkpoint folder or a root (then its newest committed checkpoint). Tensors,
    DTensor local tensors and FlatShard locals are overwritten in place, whatever world size,
    layout or placements saved them;
    other values are replaced in their dicts and lists with the saved values and types; PerRank
    values are restored at the saved world size and reported unavailable at another.
    ``strict``: a name missing from the checkpoint raises :class:`NotFound`, a checkpoint entry
    nothing loads raises :class:`InvalidArgument`, before anything is read (a value PyTorch DCP
    stored leaf by leaf matches when every leaf of the value passed is there); not strict, both
    come back in the report. Every rank raises the same error, naming each rank's cause, with the
    first failing rank's class. An optimizer's
    ``state_dict()`` before its first step holds no state tensors to load into: build the state
    first (``get_state_dict(model, optim)`` does), then ``optim.load_state_dict(...)`` after.
    ``strip_prefix`` drops a prefix from the checkpoint's names (e.g. ``"module."``).
    An optimizer's ``param_groups`` saved with other groups than the optimizer passed has
    (their number, their sizes, or, named as ``get_state_dict`` names them, their members)
    raises :class:`InvalidArgument` at the end of a strict load, the tensors loaded and no value
    restored; not strict, the passed groups stay and the reason is in ``report.unavailable``.
    A wrong dtype or shape raises :class:`InvalidArgument` naming the tensor; corrupt data
    raises :class:`DataLoss` naming the file.

    Tuning (the defaults choose from the job and the storage; a bad value is refused on every
    rank): ``replicated_reads``: how tensors every rank holds whole (DDP-style) are loaded:
    ``"broadcast"`` (one rank reads each, then broadcasts: storage, or several hosts),
    ``"every-rank"`` (each rank reads them: one host and tmpfs) or ``"auto"``; the environment
    variable ``SHARDCKPT_REPLICATED_READS``, where set, overrides it.
    ``manifest_sharing``: ``"every-rank"`` (rank 0 sends the manifest's text and every rank parses
    it), ``"root"`` (rank 0 sends its decoded copy: hosts with fewer CPUs than ranks) or
    ``"auto"``; rank 0's choice holds for all.
    ``read_ahead_max_bytes``: a rank reads its own data file, up to this size, while the manifest
    is decoded (default 64 MiB; 0 never), where that pays: at the saved world size, with a
    manifest of at least 256 KiB and a file at most 16 times its size, on storage with io_uring
    and O_DIRECT (not tmpfs); ``LoadReport.bytes_read_ahead`` says what it read.
    """
    from . import _core
    comm = resolve(comm)
    error = ("OK", "")
    pieces: list = []
    wanted: Dict[str, Any] = {}
    copies: list = []
    names: List[str] = []
    leaves: List[List[str]] = []
    nothing_stored: List[str] = []
    root, root_error = _path_arg(path, "path")
    choices = ("auto", "auto")
    try:
        if root_error[0] != "OK":
            raise InvalidArgument(root_error[1])
        for what, choice in (("strip_prefix", strip_prefix), ("replicated_reads", replicated_reads),
                             ("manifest_sharing", manifest_sharing)):
            if not isinstance(choice, str):
                raise InvalidArgument("%s must be a str, not %s" % (what, type(choice).__name__))
            check_unicode(choice, lambda: what)
        choices = (replicated_reads, manifest_sharing)
        pieces, wanted, copies = _describe_load(state_dict)
        # The engine gives the strict verdict over tensors and values together, before reading:
        # it is told which names this state dict takes as values, and the names of the leaves
        # a DCP folder may hold a value's parts under (made of the value's own keys).
        names = list(wanted)
        leaves = [[] if isinstance(wanted[n], PerRank) else dcp_leaf_names(n, wanted[n]) for n in names]
        for leaf in (leaf for group in leaves for leaf in group):
            check_unicode(leaf, lambda: "a key inside the value named")
        nothing_stored = [n for n in names if dcp_stores_nothing_of(wanted[n])]
    except Exception as failure:  # noqa: BLE001 - told to every rank (_refusal)
        error = _refusal(failure)
        pieces, wanted, copies, names, leaves, nothing_stored = [], {}, [], [], [], []
        strip_prefix = ""  # refused with the rest; not handed to the engine as it is
    # A bad size is refused on every rank with the rest, never raised here on one rank alone:
    # the others would pair their collectives with this rank's next call.
    ahead_max = None
    if read_ahead_max_bytes is not None:
        size = read_ahead_max_bytes
        if isinstance(size, numbers.Integral) and not isinstance(size, bool) and 0 <= size < 2 ** 64:
            ahead_max = int(size)
        elif error[0] == "OK":
            error = ("InvalidArgument", "read_ahead_max_bytes=%r: a whole number of bytes, 0 to 2**64 - 1"
                     % (size,))
    flags = (True, True)
    try:
        flags = (bool(strict), bool(verify_checksums))  # a tensor's truth value raises: told to every rank
    except Exception as failure:  # noqa: BLE001
        if error[0] == "OK":
            error = _refusal(failure)
    strict = flags[0]
    code, message, raw = _core.load(comm, root, pieces, flags[0], strip_prefix, flags[1], error, names, leaves,
                                    *choices, ahead_max, nothing_stored)
    raise_for(code, message)
    # Blobs: matched here, and any failure agreed on, so every rank raises the same.
    saved = {_strip(name, strip_prefix): blob for name, blob in raw["blobs"].items()}
    pieces_of: Dict[str, List[str]] = {}  # a value a DCP folder holds leaf by leaf
    for name, current in wanted.items():
        if name not in saved and not isinstance(current, PerRank):
            leaves = dcp_leaves(name, current, saved)
            if leaves is not None:  # [] for a value DCP stored nothing of (the engine agreed)
                pieces_of[name] = leaves
    regrouped = {leaf for leaves in pieces_of.values() for leaf in leaves}
    missing = list(raw["missing"]) + [n for n in wanted if n not in saved and n not in pieces_of]
    elsewhere = set(raw["values_loaded_elsewhere"])  # another rank loads them (names as renamed)
    unexpected = list(raw["unexpected"]) + [n for n in saved
                                            if n not in wanted and n not in regrouped and n not in elsewhere]
    values: Dict[str, Any] = {}
    unavailable: Dict[str, str] = {}

    def take(name: str, value: Any, current: Any) -> None:
        """A saved value to restore, unless it is an optimizer's param_groups of another grouping."""
        groups_differ = param_groups_differ(name, value, current)
        if groups_differ is None:
            values[name] = value
        elif strict:
            raise InvalidArgument(groups_differ + ": build the optimizer with the saved run's groups, or load "
                                  "with strict=False to keep this optimizer's groups and settings (the state "
                                  "tensors are loaded either way)")
        else:
            unavailable[name] = groups_differ + " (this optimizer's groups and settings kept)"

    error = ("OK", "")
    try:
        # What the engine's name-level verdict cannot see: a value DCP stored leaf by leaf whose
        # leaves do not all match the value's nesting.
        if strict and (missing or unexpected):
            raise _strict_refusal(raw["path"], missing, unexpected)
        for name, current in wanted.items():
            if name in pieces_of:
                restored: Dict[str, Any] = {}  # leaves torch's weights_only reader restored
                lost = []
                for leaf in pieces_of[name]:
                    available, data, reason = saved[leaf]
                    if not available:
                        ok, value = _weights_only(data, reason)
                        if ok:
                            restored[leaf] = value
                        else:
                            lost.append("'%s': %s" % (leaf, value))
                if lost:
                    unavailable[name] = lost[0]
                else:
                    take(name, regroup(name, current, saved,
                                       lambda leaf, old: restored[leaf] if leaf in restored
                                       else decode_blob(saved[leaf][1], leaf, old)), current)
                continue
            if name not in saved:
                continue
            available, data, reason = saved[name]
            if isinstance(current, PerRank):
                if available:
                    current.value = decode_blob(data, name, current.value)
                else:
                    unavailable[name] = reason
            elif available:
                take(name, decode_blob(data, name, current), current)
            else:
                restored, value = _weights_only(data, reason)
                if restored:
                    values[name] = value
                else:
                    unavailable[name] = value
    except Exception as failure:  # noqa: BLE001 - told to every rank (_refusal)
        error = _refusal(failure)
    # Every tensor read is in place before a refusal of the values: targets loaded through a
    # temporary (device, strided) are no different from those the engine wrote into.
    with torch.no_grad():
        for target, temporary in copies:
            target.copy_(temporary)
    raise_for(*comm.agree(*error)[:2])
    restore(state_dict, values)
    return LoadReport(path=raw["path"], step=raw["step"], saved_world_size=raw["saved_world_size"],
                      missing=missing, unexpected=unexpected, unavailable=unavailable,
                      bytes_read=raw["bytes_read"], bytes_wanted=raw["bytes_wanted"],
                      bytes_received=raw["bytes_received"], phases=raw["phases"],
                      bytes_read_ahead=raw["bytes_read_ahead"],
                      every_rank_parsed_manifest=raw["every_rank_parsed_manifest"],
                      loaded_in_part=list(raw["loaded_in_part"]))



def _weights_only(data: bytes, reason: str) -> Tuple[bool, Any]:
    """A DCP byte item the engine does not read (more than plain values: a dtype, a tensor, an
    object) comes with its torch.save zip: torch's weights_only unpickler, which runs no code
    either, may restore it. (True, value), or (False, why not)."""
    if not data.startswith(b"PK\x03\x04"):
        return False, reason
    import io
    try:
        return True, torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 - any refusal: the item stays unavailable, with why
        # torch's message is mostly advice to run the pickle; the reason is the line naming
        # what it refused ("unsupported GLOBAL posix.system", 1.13's "Unsupported class ...").
        text = str(error)
        lines = [line.strip() for line in text.replace("WeightsUnpickler error: ", "\n").splitlines()]
        why = next((line for line in lines if "nsupported" in line), lines[0] if lines else type(error).__name__)
        return False, "%s; torch.load(weights_only=True) refuses it too: %s" % (reason, why)


# ---- Async save -----------------------------------------------------------------------------

class AsyncSaveHandle:
    """A save in flight, from :func:`async_save`.

    ``wait()`` blocks until the checkpoint is committed (or failed) and raises the save's error,
    the same :class:`ShardckptError` subclass on every rank; it may be called many times and
    raises each time. ``done()`` says whether the persist has finished, without blocking.
    ``fence()`` matters for ``copy_while_training=True`` saves only (it returns at once for the
    others): it blocks until the snapshot copy is taken, after which the tensors may change.
    """

    def __init__(self, handle: Any, saver: Any = None, keep: Optional[List[Any]] = None) -> None:
        self._handle = handle
        self._seen = False  # its outcome reached the caller (wait(), or a failed fence())
        self._saver = saver  # set while a copy-while-training snapshot is not fenced yet
        self._keep = keep  # the tensors that copy reads, alive until fence()
        self._fence: Tuple[str, str] = ("OK", "")
        self.fence_seconds = 0.0

    @property
    def step(self) -> int:
        """The step this save writes."""
        return int(self._handle.step)

    def fence(self) -> float:
        """Blocks until this save's snapshot copy is done and returns how long it blocked, in
        seconds (0 when the copy had finished already). Call it right before the state changes
        (before ``optimizer.step()``). A failed copy raises here, the same
        :class:`ShardckptError` subclass on every rank (collective in effect: every rank calls
        it), and again on every later ``fence()`` or ``wait()``; no files are written for it."""
        self._take_fence()
        if self._fence[0] != "OK":
            self._saw_outcome()  # the save failed, and the caller is told here
        raise_for(*self._fence)
        return self.fence_seconds

    def _take_fence(self) -> None:
        """Waits for the snapshot copy and keeps its outcome, telling the caller nothing (the
        library's own fence before the next save: the failure stays unseen until the caller's
        fence() or wait(), or is logged once no handle can see it)."""
        if self._saver is not None:
            from . import _core
            code, message, seconds = _core.saver_fence(self._saver)
            self._saver, self._keep = None, None
            self._fence = (code, message)
            self.fence_seconds = float(seconds)

    def done(self) -> bool:
        """Whether the background persist has finished (successfully or not)."""
        return bool(self._handle.done())

    def wait(self) -> None:
        """Waits for the persist (collective in effect: every rank gets the same outcome)."""
        self._saw_outcome()  # its outcome is the caller's from here: not logged
        self.fence()
        code, message, _ = self._handle.wait()
        raise_for(code, message)

    def _saw_outcome(self) -> None:
        """The caller is told this save's outcome: it is no longer logged as unseen, whenever
        this handle is dropped (the flag alone went with the handle, and a failure wait() had
        raised was logged again as one "no wait() saw")."""
        self._seen = True
        with _unseen_lock:  # a waiter thread's wait() beside the main thread's next async_save
            _unseen[:] = [entry for entry in _unseen if entry[2] is not self._handle]


_savers_lock = threading.Lock()
# id(comm) -> (comm, engine AsyncSaver): one per communicator, kept across calls so its staging
# is reused; each save sets its retention and user metadata on it.
_savers: Dict[int, Tuple[Any, Any]] = {}
_savers_atexit = False
# id(engine saver) -> the copy-while-training handle whose fence() has not run yet.
_unfenced: Dict[int, AsyncSaveHandle] = {}
# Async saves whose outcome no caller has seen yet: (id(engine saver), step, engine handle,
# weak reference to the AsyncSaveHandle). A failure nobody can see any more (its handle dropped,
# or the process exiting) is logged as an error, never lost without a word.
_unseen: List[Tuple[int, int, Any, Any]] = []
_unseen_lock = threading.Lock()  # every change to _unseen: list rewrites are not atomic


def _log_unseen_failures(saver: Any = None) -> None:
    """Logs the failures of saves whose outcome no caller saw and none can see any more: with
    ``saver``, those of its saves whose handle was dropped (the engine has waited for them);
    without, at exit, all of them. Each rank has the same outcome, so each logs it."""
    from . import _core
    keep, unseen = [], []
    with _unseen_lock:
        for entry in _unseen:
            key, step, engine_handle, ref = entry
            handle = ref()
            if handle is not None and handle._seen:
                continue
            if saver is not None and (key != id(saver) or handle is not None):
                keep.append(entry)  # another saver's, or a handle the caller may still wait on
                continue
            unseen.append((step, engine_handle))
        _unseen[:] = keep
    for step, engine_handle in unseen:  # waited for outside the lock
        code, message, _ = engine_handle.wait()
        if code != "OK":
            _core.log_error("the async save of step %d failed, and no wait() saw it: %s: %s"
                            % (step, code, message))


def _drop_savers() -> None:
    """At exit, before MPI is finalized (registered after world()): waits for every saver's
    copy and persist in flight, the savers a user's handle still holds included, and only then
    lets go of the savers, the tensors unfenced copies read and the communicators made over
    foreign groups."""
    from . import _core
    with _savers_lock:
        savers = [saver for _, saver in _savers.values()]
        savers += [h._saver for h in _unfenced.values() if h._saver is not None]
    for saver in savers:
        _core.saver_wait(saver)  # the GIL released: a persist over torch.distributed needs it
    # Nobody would see these errors otherwise. The exit status stays the caller's: an exit
    # handler cannot change it, and ending the process here would lose what the interpreter
    # has yet to flush and the exit handlers registered before this one.
    _log_unseen_failures()
    with _savers_lock:
        _unfenced.clear()
        _savers.clear()
    forget_foreign()


def _fence_unfenced(saver: Any) -> None:
    """Runs the fence of ``saver``'s copy-while-training handle not fenced yet, through the
    handle, which keeps the outcome: its own fence() raises a failed copy later as promised
    (a bare wait on the saver would take that outcome with it)."""
    previous = _unfenced.pop(id(saver), None)
    if previous is not None and previous._saver is saver:
        previous._take_fence()  # a failure is raised by that handle's fence()/wait(), or logged


def _wait_for_savers_of(comm: Any) -> None:
    """Waits for the copies and persists in flight of every engine saver made over ``comm``,
    whatever its retention; their outcomes are their handles' to report."""
    with _savers_lock:
        held = _savers.get(id(comm))
    if held is not None and held[0] is comm:
        _finish_in_flight(held[1])


def _finish_in_flight(saver: Any) -> None:
    """Waits for ``saver``'s copy and persist in flight (an unfenced snapshot taken through its
    handle, which keeps the outcome) and logs the failures no handle can see any more."""
    from . import _core
    _fence_unfenced(saver)
    _core.saver_wait(saver)
    _log_unseen_failures(saver)


def _saver_for(comm: Any, options: Tuple[int, int, str, bool],
               user_metadata: Mapping[str, str], state_paths: str) -> Any:
    """The engine AsyncSaver of this communicator, kept across calls so its staging is reused,
    with this save's retention policy and user metadata (a save in flight keeps its own: the
    engine waits for it before the next one starts)."""
    global _savers_atexit
    from . import _core
    with _savers_lock:
        held = _savers.get(id(comm))
    if held is not None and held[0] is comm:
        _core.saver_set_options(held[1], *options, dict(user_metadata), state_paths)
        return held[1]
    code, message, saver = _core.create_saver(comm, *options, dict(user_metadata), state_paths,
                                              torch.__version__)  # collective (duplicates comm)
    if code == "FailedPrecondition" and "MPI_THREAD_MULTIPLE" in message and \
            "mpi4py" in sys.modules:
        message += ("; mpi4py initialized MPI here: set mpi4py.rc.thread_level = 'multiple' "
                    "(its default) before 'from mpi4py import MPI'")
    raise_for(code, message)
    with _savers_lock:
        _savers[id(comm)] = (comm, saver)
        if not _savers_atexit:
            atexit.register(_drop_savers)
            _savers_atexit = True
    return saver


def async_save(state_dict: Mapping[str, Any], root: PathLike, step: int, *, keep_last: int = 0,
               keep_best: int = 0, best_metric: str = "", best_higher_is_better: bool = False,
               metrics: Optional[Mapping[str, float]] = None,
               user_metadata: Optional[Mapping[str, str]] = None,
               comm: Any = None, copy_while_training: bool = False) -> AsyncSaveHandle:
    """Starts saving ``state_dict`` as checkpoint ``step`` under ``root`` and returns once a
    snapshot is taken (collective: every rank calls it).

    ``copy_while_training=True`` returns before the snapshot instead: the copy runs on a
    background thread while the training loop goes on reading the tensors (a forward and
    backward pass), and the loop calls :meth:`AsyncSaveHandle.fence` before anything changes
    them (``optimizer.step()``, ``zero_grad`` of a saved gradient, a load): the values saved
    are those at this call only if no tensor in ``state_dict`` is written, resized or freed
    until ``fence()`` returns. ``fence()`` blocks only for what is left of the copy. Plain
    values (ints, strings, per-rank blobs) are encoded at this call. A second save waits for
    this one's copy and persist first::

        h = shardckpt.async_save(sd, root, step, copy_while_training=True)
        loss = model(batch).sum(); loss.backward()   # reads the parameters only
        h.fence()                                    # the snapshot is taken
        optimizer.step()

    The tensors may be changed as soon as this returns: the engine copied them into a staging
    area that it keeps, per communicator, for every later async save (so only the first one
    allocates). The files are written by a background thread; call
    :meth:`AsyncSaveHandle.wait` before relying on the checkpoint. One save is in flight at a
    time: a second ``async_save`` first waits for the previous one. Errors describing the state
    (an unsupported value) and errors found before the snapshot (a root that cannot be made,
    for one) raise here; errors writing the files raise from ``wait()``, on every rank.

    Under mpirun MPI must provide MPI_THREAD_MULTIPLE (shardckpt asks for it when it
    initializes MPI; else this raises :class:`FailedPrecondition`); over torch.distributed the
    persist runs on a gloo group of its own, made here on the first call by the group's ranks
    (on a subgroup, torch >= 2.1 is needed: its ``use_local_synchronization``). ``keep_last``/``keep_best``/
    ``best_metric``/``user_metadata`` are as for :func:`save` (pruning runs after the commit, in
    the background); ``metrics`` are recorded in the manifest.
    """
    from . import _core
    comm = resolve(comm)
    keep: List[torch.Tensor] = []
    call = _describe_save_call(state_dict, step, metrics, user_metadata, keep, root,
                               (keep_last, keep_best, best_metric, best_higher_is_better))
    try:
        copying = bool(copy_while_training)
    except Exception as failure:  # noqa: BLE001 - a tensor's truth value: told to every rank
        copying = False
        if call.error[0] == "OK":
            call = call._replace(error=_refusal(failure))
    step = call.step
    saver = _saver_for(comm, tuple(call.retention), call.user_metadata, call.state_paths)
    _finish_in_flight(saver)  # the engine's save would wait for the one in flight anyway
    if copying:
        code, message, handle = _core.start_save(comm, saver, call.root, step, call.pieces,
                                                 call.blobs, call.metrics, call.error)
        raise_for(code, message)
        started = AsyncSaveHandle(handle, saver, keep + [state_dict])
        _unfenced[id(saver)] = started
        with _unseen_lock:
            _unseen.append((id(saver), step, handle, weakref.ref(started)))
        return started
    code, message, handle = _core.async_save(comm, saver, call.root, step, call.pieces, call.blobs,
                                             call.metrics, call.error)
    raise_for(code, message)
    started = AsyncSaveHandle(handle)
    with _unseen_lock:
        _unseen.append((id(saver), step, handle, weakref.ref(started)))
    return started


# ---- The command line's verbs, single process ----------------------------------------------

@dataclasses.dataclass
class VerifyProblem:
    """One damaged block: ``file`` (relative to the checkpoint), byte ``offset``, the tensors
    (``entries``) and values (``blobs``) stored there, and ``what`` is wrong."""
    file: str
    offset: int
    entries: List[str]
    blobs: List[str]
    what: str
    holders: str = ""  # entries and blobs as the message names them ("padding" for none)
    # The bytes could not be read (a permission, an I/O error): not known to be damaged.
    unreadable: bool = False


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify` checked; ``problems`` is always empty when it returns (a damaged
    checkpoint raises :class:`DataLoss`)."""
    checkpoint: str
    files: int
    bytes_checked: int
    blocks_checked: int
    problems: List[VerifyProblem]
    # False for a PyTorch DCP folder, which stores no checksums: only its structure was checked,
    # and ``note`` says so (``import_checkpoint`` of the folder gains checksums).
    checksums: bool = True
    note: str = ""


def release_staging() -> None:
    """Frees the staging memory the engine keeps between saves and loads of this process.

    Each save and load reuses one set of aligned (pinned, where tensors are on a GPU) staging
    buffers, 64 MiB by default, instead of allocating and first-touching a new set every time.
    A job done with checkpoints, or short of host memory, can give it back; the next save or
    load allocates again. Async savers keep staging of their own until they are dropped."""
    from . import _core
    _core.release_staging()


def inspect(path: PathLike) -> Dict[str, Any]:
    """What a checkpoint holds (``shardckpt inspect --json``): a dict with ``checkpoint``,
    ``step``, ``world_size``, ``format_version``, ``created``, ``metrics``, ``entries`` (each
    ``{"name", "dtype", "shape", "bytes", "chunks"}``), ``blobs`` (of a PyTorch DCP folder with
    ``plain``, and ``not_plain_because`` where it holds more than plain values), ``tensor_bytes``,
    ``files`` and ``file_bytes``. ``path``: a checkpoint folder or a root (its newest checkpoint)."""
    from . import _core
    code, message, out = _core.inspect(_fs(path))
    raise_for(code, message)
    return dict(out)


def verify(path: PathLike) -> VerifyReport:
    """Reads every byte of a checkpoint and checks every checksum (``shardckpt verify``).

    Returns the report when the checkpoint is sound. A damaged one raises :class:`DataLoss`
    whose message names each damaged file, offset and entries (``problems`` on the exception
    holds the :class:`VerifyProblem` list; files this process may not read, and nothing
    damaged, raise :class:`IoError` the same way); one that cannot be examined at all (no manifest)
    raises what the engine reports (:class:`NotFound`, :class:`DataLoss`...).
    """
    from . import _core
    code, message, raw = _core.verify(_fs(path))
    raise_for(code, message)
    problems = [VerifyProblem(file, offset, list(entries), list(blobs), what, holders, unreadable)
                for file, offset, entries, blobs, what, holders, unreadable in raw["problems"]]
    report = VerifyReport(checkpoint=raw["checkpoint"], files=raw["files"],
                          bytes_checked=raw["bytes_checked"], blocks_checked=raw["blocks_checked"],
                          problems=problems, checksums=raw.get("checksums", True), note=raw.get("note", ""))
    if problems:
        # Files this process may not read tell nothing of the bytes: IoError, not DataLoss.
        damaged = any(not p.unreadable for p in problems)
        error = (DataLoss if damaged else IoError)("checkpoint %s %s: %s" % (
            report.checkpoint, "is damaged" if damaged else "cannot be read (not known to be damaged)", "; ".join(
                "%s/%s at offset %d (%s): %s" % (report.checkpoint, p.file, p.offset, p.holders, p.what)
                for p in problems)))
        error.problems = problems  # type: ignore[attr-defined]
        error.report = report  # type: ignore[attr-defined]
        raise error
    return report


def _globs(value: Union[str, Sequence[str]], argument: str) -> List[str]:
    # One string is one glob, as the CLI's --include takes it: list("model.*") would be eight
    # one-character globs, and "*" among them matches every entry.
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise InvalidArgument("%s= takes a glob or a list of globs, not %s" % (argument, type(value).__name__))
    globs = list(value)  # any iterable of str: a list, a tuple, dict keys, a generator
    for glob in globs:
        if not isinstance(glob, str):
            raise InvalidArgument("%s= takes globs as str, not %s (%r)" % (argument, type(glob).__name__, glob))
    return globs


def consolidate(path: PathLike, out: PathLike, format: Optional[str] = None, *,
                include: Union[str, Sequence[str]] = (), exclude: Union[str, Sequence[str]] = (),
                strip_prefix: str = "", dtype: Optional[str] = None, max_shard_bytes: int = 0,
                gguf_architecture: str = "", gguf_name: str = "",
                gguf_metadata: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """One state-dict file from a sharded checkpoint (``shardckpt consolidate``).

    ``format``: ``"torch"`` (a .pt that ``torch.load(weights_only=True)`` reads),
    ``"safetensors"`` or ``"gguf"``; None picks it from ``out``'s extension. ``include``/
    ``exclude``: globs of entry names (one string is one glob); ``dtype``: cast floating tensors to ``"bf16"``, ``"fp16"``
    or ``"fp32"``; ``max_shard_bytes``: split safetensors output. GGUF needs
    ``gguf_architecture`` (see :func:`consolidate_gguf`). Returns ``{"checkpoint", "files",
    "sha256", "entries", "tensor_bytes", "bytes_read", "aliases", "values", "skipped"}`` (aliases:
    tied entries written as one storage; values: the non-tensor values written; skipped: those
    not written, each with the reason), as ``shardckpt consolidate --json`` says."""
    if format == "gguf" or (format is None and os.fsdecode(out).endswith(".gguf")):
        return consolidate_gguf(path, out, gguf_architecture, name=gguf_name,
                                metadata=gguf_metadata, include=include, exclude=exclude,
                                strip_prefix=strip_prefix, dtype=dtype)
    from . import _core
    code, message, result = _core.consolidate(_fs(path), _fs(out), format or "", _globs(include, "include"),
                                              _globs(exclude, "exclude"), strip_prefix, dtype or "",
                                              _whole("max_shard_bytes", max_shard_bytes, 0, 2 ** 64 - 1))
    raise_for(code, message)
    return dict(result)


def _raise_open_file_limit() -> None:
    # An import or reshard writes every output rank's file at once, each with its own
    # descriptor: at the usual soft limit of 1024, a reshard to about 500 ranks failed with
    # EMFILE. The hard limit is the operator's ceiling; the soft one is only a default, which
    # the `shardckpt` CLI raises too.
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # the engine's EMFILE error names the limit then


def _whole(name: str, value: Any, least: int, most: int) -> int:
    """``value`` as an int in [least, most], or InvalidArgument naming ``name`` (pybind's
    TypeError listed its own signature instead)."""
    whole = None
    if not isinstance(value, bool):
        try:
            # An int, a whole float (5e9 bytes), a numpy integer, a str of digits (from the environment).
            whole = int(value) if isinstance(value, (numbers.Integral, str)) else \
                (int(value) if float(value).is_integer() else None)
        except (TypeError, ValueError, OverflowError):
            whole = None
    if whole is None or not least <= whole <= most:
        raise InvalidArgument("%s must be a whole number from %d to %d, not %r" % (name, least, most, value))
    return whole


def import_checkpoint(src: PathLike, out_root: PathLike, world_size: int, layout: str = "flat") -> Dict[str, Any]:
    """A torch.save file (under any name: ``.pt``, ``.ckpt``...), a ``.safetensors`` file, a
    Hugging Face sharded set (``*.safetensors.index.json`` or ``pytorch_model.bin.index.json``,
    or the folder holding one) or a PyTorch DCP folder as a sharded checkpoint under
    ``out_root`` for ``world_size`` ranks (``shardckpt import``); ``layout``: ``"flat"``,
    ``"dim0"`` or ``"replicated"``. ``out_root`` is a new root (missing or without checkpoints:
    one that holds a checkpoint raises AlreadyExists). It
    writes every rank's file at once, so it raises this process's soft open-file limit to the
    hard one, as the command does (``reshard`` too).
    Returns the keys of ``shardckpt import --json``: ``{"checkpoint", "out", "source", "step",
    "tensors", "tensor_bytes", "world_size", "layout", "values", "skipped"}``, and ``"path"`` and
    ``"bytes"`` (the same as ``"checkpoint"`` and ``"tensor_bytes"``) (values: the non-tensor
    values kept; skipped: those that could not be, each "name (why)")."""
    from . import _core
    _raise_open_file_limit()
    code, message, result = _core.convert(True, _fs(src), _fs(out_root), _whole("world_size", world_size, 1, 2 ** 31 - 1),
                                          layout)
    raise_for(code, message)
    return dict(result)


def reshard(path: PathLike, out_root: PathLike, world_size: int, layout: str = "flat") -> Dict[str, Any]:
    """A checkpoint rewritten for ``world_size`` ranks under ``out_root``, a new root (one that
    holds a checkpoint raises AlreadyExists), without a job (``shardckpt reshard``). Returns the
    keys of ``shardckpt reshard --json``, as :func:`import_checkpoint` does (values: those carried; skipped: per-rank blobs, which have no
    meaning at another world size, each ``"name@rankN (why)"``)."""
    from . import _core
    _raise_open_file_limit()
    code, message, result = _core.convert(False, _fs(path), _fs(out_root), _whole("world_size", world_size, 1, 2 ** 31 - 1),
                                          layout)
    raise_for(code, message)
    return dict(result)


def export(path: PathLike, out: PathLike, format: str = "dcp", *, window_bytes: int = 32 << 20) -> Dict[str, Any]:
    """A checkpoint as a PyTorch Distributed Checkpoint folder ``out`` (``shardckpt export
    --format dcp``): ``torch.distributed.checkpoint.load`` reads it at any world size, into
    DTensors or plain tensors, and ``dcp_to_torch_save`` converts it. Streams with bounded memory
    (``window_bytes`` of tensor data read at a time).
    Returns ``{"checkpoint", "out", "files", "tensors", "chunks", "byte_items", "tensor_bytes",
    "bytes_read", "skipped"}`` (skipped: values a DCP folder has no place for, with why)."""
    from . import _core
    code, message, result = _core.export(_fs(path), _fs(out), format, int(window_bytes))
    raise_for(code, message)
    return dict(result)


def consolidate_gguf(path: PathLike, out: PathLike, architecture: str, *, name: str = "",
                     metadata: Optional[Mapping[str, Any]] = None, include: Union[str, Sequence[str]] = (),
                     exclude: Union[str, Sequence[str]] = (), strip_prefix: str = "",
                     dtype: Optional[str] = None) -> Dict[str, Any]:
    """One GGUF (version 3) file from a checkpoint (``shardckpt consolidate --format gguf``):
    ``general.architecture`` and ``general.name`` from ``architecture`` and ``name``, then the
    ``metadata`` keys (str, int, float and bool values); float32, float16 and bfloat16 tensors as
    they are (other dtypes are refused naming the tensor: ``exclude`` them, or cast floating ones
    with ``dtype="bfloat16"``, ``"float16"`` or ``"float32"``). Streams with bounded memory.
    Returns ``{"checkpoint", "files", "sha256", "entries", "tensor_bytes", "bytes_read"}``."""
    import json
    from . import _core
    code, message, result = _core.consolidate_gguf(
        _fs(path), _fs(out), str(architecture), str(name), json.dumps(dict(metadata or {})),
        _globs(include, "include"), _globs(exclude, "exclude"), strip_prefix, dtype or "")
    raise_for(code, message)
    return dict(result)


__all__ += ["export", "consolidate_gguf"]
