"""Runs under `mpirun -np N python3 -m pytest` or `torchrun --nproc_per_node N -m pytest`: every rank runs every test in the same order,
so each test is one collective. Without the built extension (or torch) the run exits 77, which
CTest reports as skipped."""

import os
import sys

import pytest

try:
    import torch  # noqa: F401
    import shardckpt
    from shardckpt import _core  # noqa: F401
    MISSING = None
except ImportError as error:  # the module was not built, or this Python has no torch
    MISSING = str(error)


# Set by a test that leaves a gloo group out of step on purpose (a collective only some ranks
# posted: the deadline test). torch tears such a group down at exit and may abort the process
# (torch 1.13: "terminate called without an active exception", seen on the rank that never
# joined), after every test passed: such a run ends with os._exit once pytest has reported.
_OUT_OF_STEP_GROUPS = []
_EXIT_STATUS = [0]


def left_a_group_out_of_step(group):
    _OUT_OF_STEP_GROUPS.append(group)


def pytest_sessionfinish(session, exitstatus):
    if MISSING and exitstatus in (0, 5):  # 5: nothing collected
        sys.stderr.write("skipped: shardckpt is not importable here (%s)\n" % MISSING)
        session.exitstatus = 77
    _EXIT_STATUS[0] = int(session.exitstatus)


def _under_torchrun_with_a_group():
    # Never under mpirun: os._exit there would skip MPI_Finalize, which mpirun reports as a failure.
    dist = sys.modules.get("torch.distributed")
    return ("TORCHELASTIC_RUN_ID" in os.environ and dist is not None and dist.is_available()
            and dist.is_initialized())


def pytest_unconfigure(config):
    # Under torchrun, torch 1.13 also aborted at exit (the same message, about 1 run in 60) on a
    # rank whose gloo group was in step, after every test passed: a process group is never torn
    # down by the interpreter here, whatever the tests did with it.
    if _OUT_OF_STEP_GROUPS or _under_torchrun_with_a_group():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[0])


@pytest.fixture(scope="session")
def comm():
    # Under torchrun the job's own process group carries the collectives (gloo).
    if "TORCHELASTIC_RUN_ID" in os.environ and not shardckpt.launched_by_mpi():
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
    return shardckpt.world()


@pytest.fixture
def root(request, comm):
    """A folder every rank names alike, fresh for each test (the driver empties the work dir)."""
    base = os.environ.get("SHARDCKPT_PY_WORK", "/tmp/shardckpt-pytest")
    return os.path.join(base, "np%d" % comm.size, request.node.name)


def barrier(comm):
    code, message, _ = comm.agree("OK", "")
    assert code == "OK", message


def flip_byte(comm, path, offset=100):
    """Rank 0 damages one byte of ``path`` (a data file); every rank returns once it is done."""
    if comm.rank == 0:
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x40]))
    barrier(comm)
