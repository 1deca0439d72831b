"""Which processes a collective call spans: MPI_COMM_WORLD under an MPI launcher, else one."""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import threading
from typing import Any, Dict, Optional, Tuple

from .errors import FailedPrecondition, InvalidArgument, raise_for

# Set by mpirun/mpiexec (OpenMPI, MPICH/PMI, PMIx, MVAPICH) in every rank's environment.
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
_lock = threading.Lock()
_world: Optional[Any] = None


def launched_by_mpi() -> bool:
    """Whether this process was started by mpirun/mpiexec (or srun with PMI)."""
    return any(name in os.environ for name in _MPI_LAUNCHER_VARS)


def _core() -> Any:
    from . import _core  # noqa: WPS433 (imported late: a missing build fails at first use)
    return _core


def _promote_libmpi() -> None:
    """OpenMPI loads its transports as plugins that expect libmpi's symbols to be global; a
    Python extension is opened RTLD_LOCAL, so libmpi is promoted first (as mpi4py does)."""
    path = ctypes.util.find_library("mpi")
    if path:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass


def world() -> Any:
    """The communicator collective calls use by default.

    Under ``mpirun``: every rank of MPI_COMM_WORLD (MPI is initialized here with
    MPI_THREAD_MULTIPLE unless the program did it already, and finalized at exit if shardckpt
    initialized it). Else, where torch.distributed is initialized (torchrun): its default group
    (over gloo; a gloo group is made when the default is nccl). With no launcher: this process
    alone. Under torchrun before init_process_group: :class:`shardckpt.FailedPrecondition`,
    rather than saving as N separate jobs.
    """
    global _world
    with _lock:
        if _world is not None:
            return _world
        if launched_by_mpi():
            _promote_libmpi()
            code, message, comm = _core().mpi_world()
            raise_for(code, message)
            _finalize_at_exit()
        elif _torch_distributed_initialized():
            comm = from_process_group(None)
            # Dropped while the interpreter is whole: a gloo group released late in shutdown
            # can end the process in std::terminate (torch 1.13).
            atexit.register(_forget_world)
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise FailedPrecondition(
                "WORLD_SIZE=%s but torch.distributed is not initialized: call "
                "torch.distributed.init_process_group() first (or launch with mpirun)"
                % os.environ["WORLD_SIZE"])
        else:
            comm = _core().single()
        _world = comm
        return comm


_finalize_registered = False


def _finalize_at_exit() -> None:
    """Finalizes MPI at exit if shardckpt initialized it (mpi4py finalizes what it started)."""
    global _finalize_registered
    if not _finalize_registered:
        _finalize_registered = True
        atexit.register(_core().mpi_finalize)


def _forget_world() -> None:
    global _world
    with _lock:
        _world = None


def _torch_distributed_initialized() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def from_process_group(group: Any) -> Any:
    """A communicator over a torch.distributed process group (None: the default group).
    Collective: every rank of the group calls it (it may create a gloo group)."""
    from ._torch_comm import TorchGroupComm
    return _core().python_comm(TorchGroupComm(group))


_foreign: Dict[int, Tuple[Any, Any]] = {}  # id(group or mpi4py comm) -> (it, our communicator)


def _is_process_group(comm: Any) -> bool:
    try:
        import torch.distributed as dist
        return isinstance(comm, dist.ProcessGroup)
    except (ImportError, AttributeError):
        return True  # nothing to tell it by: from_process_group says what is wrong


def _is_mpi4py(comm: Any) -> bool:
    return type(comm).__module__.startswith("mpi4py") and hasattr(comm, "py2f")


def from_mpi4py(comm: Any) -> Any:
    """A communicator over an mpi4py communicator (``MPI.COMM_WORLD`` or one made by
    ``Split``/``Create``). Collective over ``comm`` (its ranks duplicate it).

    Whoever initializes MPI first decides the thread level: shardckpt asks for
    MPI_THREAD_MULTIPLE, and so does mpi4py by default (``mpi4py.rc.thread_level``); with less,
    :func:`shardckpt.async_save` raises :class:`shardckpt.FailedPrecondition`."""
    _promote_libmpi()
    code, message, made = _core().mpi_comm(int(comm.py2f()))
    raise_for(code, message)
    _finalize_at_exit()
    return made


def resolve(comm: Any) -> Any:
    """The communicator a call runs on: ``world()`` for None, a communicator from this module
    as it is, an mpi4py communicator or a torch.distributed process group wrapped, once per
    object: later calls with the same group reuse it (no new gloo group or MPI duplicate per
    save)."""
    if comm is None:
        return world()
    if isinstance(comm, _core().Comm):
        return comm
    with _lock:
        held = _foreign.get(id(comm))
        if held is not None and held[0] is comm:
            return held[1]
    if not _is_mpi4py(comm) and not _is_process_group(comm):
        # Said here, naming what it takes: it failed inside the wrapper with an AttributeError.
        # (Only this rank raises: a communicator is what ranks would agree over.)
        raise InvalidArgument("comm=%r: pass a communicator of shardckpt (world(), single_process(), "
                              "from_process_group(), from_mpi4py()), a torch.distributed process group, an mpi4py "
                              "communicator, or None" % (comm,))
    made = from_mpi4py(comm) if _is_mpi4py(comm) else from_process_group(comm)
    with _lock:
        if not _foreign:
            # Dropped while the interpreter (and MPI, torch.distributed) is whole: registered
            # after MPI's finalization, so it runs before it.
            atexit.register(forget_foreign)
        _foreign[id(comm)] = (comm, made)
    return made


def forget_foreign() -> None:
    """Drops the communicators made over mpi4py communicators and process groups (at exit,
    while MPI and torch.distributed are still whole)."""
    with _lock:
        _foreign.clear()


def single_process() -> Any:
    """A communicator of this process alone (for tools and tests under any launcher)."""
    return _core().single()
