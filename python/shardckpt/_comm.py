"""Which processes a collective call spans: MPI_COMM_WORLD under an MPI launcher, else one."""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import threading
from typing import Any, Optional

from .errors import Unimplemented, raise_for

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
    initialized it). With no launcher: this process alone. Under ``torchrun`` without MPI: not yet
    supported (raises :class:`shardckpt.Unimplemented`) rather than saving as N separate jobs.
    """
    global _world
    with _lock:
        if _world is not None:
            return _world
        if launched_by_mpi():
            _promote_libmpi()
            code, message, comm = _core().mpi_world()
            raise_for(code, message)
            atexit.register(_core().mpi_finalize)
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise Unimplemented(
                "WORLD_SIZE=%s without an MPI launcher: torchrun/torch.distributed process groups "
                "are not supported yet; launch with mpirun" % os.environ["WORLD_SIZE"])
        else:
            comm = _core().single()
        _world = comm
        return comm


def single_process() -> Any:
    """A communicator of this process alone (for tools and tests under any launcher)."""
    return _core().single()
