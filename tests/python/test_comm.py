"""Communicators: mpi4py's (COMM_WORLD and a split) under mpirun, a torch.distributed group whose
default backend is not gloo under torchrun, retention on async_save, and one communicator per
foreign group. Runs under mpirun (with mpi4py imported first, so mpi4py initializes MPI) and
under torchrun, in the torch 2.x environment (which has mpi4py)."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("shardckpt._core")  # not built: skipped, exit 77 (conftest.py)
import shardckpt  # noqa: E402
from shardckpt import _core  # noqa: E402
import conftest  # noqa: E402
from conftest import barrier  # noqa: E402

# SHARDCKPT_PY_PHASE=serialized: mpi4py initializes MPI below MPI_THREAD_MULTIPLE.
SERIALIZED = os.environ.get("SHARDCKPT_PY_PHASE") == "serialized"
if shardckpt.launched_by_mpi():
    mpi4py = pytest.importorskip("mpi4py")
    mpi4py.rc.thread_level = "serialized" if SERIALIZED else "multiple"
    from mpi4py import MPI  # initializes MPI here, before shardckpt.world()
else:
    MPI = None
needs_mpi = pytest.mark.skipif(MPI is None, reason="under mpirun only")
needs_async = pytest.mark.skipif(SERIALIZED, reason="MPI below MPI_THREAD_MULTIPLE")


def flat_state(size, rank, value):
    total = 10 * size + 3
    per = -(-total // size)
    begin, end = min(rank * per, total), min(rank * per + per, total)
    local = torch.arange(begin, end, dtype=torch.float32) + value
    return {"w": shardckpt.FlatShard(local, [total], begin), "tag": "v%d" % value}


@needs_mpi
def test_mpi_initialized_by_mpi4py_at_thread_multiple(comm, root):
    assert comm.size == MPI.COMM_WORLD.Get_size() and comm.rank == MPI.COMM_WORLD.Get_rank()
    if not SERIALIZED:
        assert MPI.Is_initialized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE
        assert _core.mpi_thread_level() == 3
        return
    assert _core.mpi_thread_level() == 2
    # Too low for an async save's persist thread: refused on every rank, saying what to set.
    with pytest.raises(shardckpt.FailedPrecondition) as error:
        shardckpt.async_save({"w": torch.ones(2)}, root, step=1, comm=MPI.COMM_WORLD)
    assert "mpi4py.rc.thread_level" in error.value.message
    shardckpt.save({"w": torch.ones(2)}, root, step=1, comm=MPI.COMM_WORLD)  # sync saves work


@needs_mpi
def test_comm_world_of_mpi4py(comm, root):
    world = MPI.COMM_WORLD
    assert shardckpt._comm.resolve(world) is shardckpt._comm.resolve(world)  # made once
    shardckpt.save(flat_state(comm.size, comm.rank, 5), root, step=1, comm=world)
    target = {"w": torch.zeros(10 * comm.size + 3), "tag": ""}
    report = shardckpt.load(target, root, comm=world)
    assert report.saved_world_size == comm.size and target["tag"] == "v5"
    assert torch.equal(target["w"], torch.arange(10 * comm.size + 3, dtype=torch.float32) + 5)


@needs_mpi
def test_a_split_communicator_saves_on_its_own(comm, root):
    color = comm.rank % 2
    half = MPI.COMM_WORLD.Split(color, comm.rank)
    try:
        mine = os.path.join(root, "group%d" % color)
        shardckpt.save(flat_state(half.Get_size(), half.Get_rank(), color), mine, step=1,
                       comm=half)
        target = {"w": torch.zeros(10 * half.Get_size() + 3), "tag": ""}
        report = shardckpt.load(target, mine, comm=half)
        assert report.saved_world_size == half.Get_size() and target["tag"] == "v%d" % color
        assert torch.equal(target["w"],
                           torch.arange(10 * half.Get_size() + 3, dtype=torch.float32) + color)
        # An error on one rank of the split is raised on every rank of the split.
        bad = {"w": torch.ones(2), "x": object() if half.Get_rank() == 0 else 1}
        with pytest.raises(shardckpt.InvalidArgument) as error:
            shardckpt.save(bad, mine, step=2, comm=half)
        assert "'x'" in error.value.message
    finally:
        shardckpt._comm.forget_foreign()
        half.Free()


@needs_mpi
@needs_async
def test_async_save_over_mpi4py_comm(comm, root):
    handle = shardckpt.async_save(flat_state(comm.size, comm.rank, 7), root, step=1,
                                  comm=MPI.COMM_WORLD)
    handle.wait()
    target = {"w": torch.zeros(10 * comm.size + 3), "tag": ""}
    shardckpt.load(target, root, comm=MPI.COMM_WORLD)
    assert target["tag"] == "v7" and float(target["w"][0]) == 7.0


@needs_async
def test_async_save_keeps_the_last_k(comm, root):
    for step in range(4):
        shardckpt.async_save({"w": torch.full((3,), float(step))}, root, step=step,
                             keep_last=2, user_metadata={"run": "r1"}).wait()
    kept = sorted(n for n in os.listdir(root) if n.startswith("step-"))
    assert kept == ["step-000000002", "step-000000003"]
    target = {"w": torch.zeros(3)}
    assert shardckpt.load(target, root).step == 3 and torch.equal(target["w"], torch.full((3,), 3.0))
    with pytest.raises(shardckpt.InvalidArgument):  # keep_best needs a metric to rank by
        shardckpt.async_save({"w": torch.zeros(3)}, root, step=9, keep_best=1).wait()


def test_a_non_gloo_default_group_gets_a_gloo_group(comm, root, monkeypatch):
    import torch.distributed as dist
    if not dist.is_initialized():
        pytest.skip("torch.distributed only")
    from shardckpt._torch_comm import TorchGroupComm
    real = dist.get_backend
    # As under nccl (no GPU here): the default group's backend is not gloo.
    monkeypatch.setattr(dist, "get_backend",
                        lambda group=None: "nccl" if group in (None, dist.group.WORLD) else real(group))
    made = TorchGroupComm(None)
    assert made.group is not dist.group.WORLD and real(made.group) == "gloo"
    assert (made.rank, made.size) == (dist.get_rank(), dist.get_world_size())
    wrapped = shardckpt.from_process_group(None)
    monkeypatch.undo()
    shardckpt.save({"w": torch.full((4,), 2.0)}, root, step=1, comm=wrapped)
    target = {"w": torch.zeros(4)}
    shardckpt.load(target, root, comm=wrapped)
    assert torch.equal(target["w"], torch.full((4,), 2.0))


def test_a_process_group_is_wrapped_once(comm):
    import torch.distributed as dist
    if not dist.is_initialized():
        pytest.skip("torch.distributed only")
    group = dist.new_group(backend="gloo")
    assert shardckpt._comm.resolve(group) is shardckpt._comm.resolve(group)


def _group_with_a_deadline(comm, monkeypatch, deadline_s="3", **group_options):
    """A communicator over a gloo group of its own (a timed-out group stays out of step) whose
    collectives give up after `deadline_s` (SHARDCKPT_COLLECTIVE_TIMEOUT_S)."""
    import torch.distributed as dist
    if not dist.is_initialized() or comm.size < 2:
        pytest.skip("torch.distributed with 2 ranks or more")
    monkeypatch.setenv("SHARDCKPT_COLLECTIVE_TIMEOUT_S", deadline_s)
    group = dist.new_group(backend="gloo", **group_options)
    conftest.left_a_group_out_of_step(group)
    return shardckpt.from_process_group(group)


def _deadline_while_the_last_rank_sleeps(comm, seconds, call):
    """The last rank is busy elsewhere for `seconds` and never joins `call`; the others run it,
    which must raise DeadlineExceeded: (that error, the seconds it took) there, None on the last."""
    import time
    if comm.rank == comm.size - 1:
        time.sleep(seconds)
        return None
    started = time.time()
    with pytest.raises(shardckpt.DeadlineExceeded) as error:
        call()
    return error.value, time.time() - started


def test_a_rank_that_never_joins_is_a_deadline_not_a_hang(comm, root, monkeypatch):
    late = _group_with_a_deadline(comm, monkeypatch)
    outcome = _deadline_while_the_last_rank_sleeps(comm, 6, lambda: shardckpt.save({"w": torch.ones(2)}, root, step=1,
                                                                                     comm=late))
    if outcome:
        error, waited = outcome
        assert "SHARDCKPT_COLLECTIVE_TIMEOUT_S" in error.message
        assert "rank %d never joined" % (comm.size - 1) in error.message
        assert waited < 6  # gave up at the deadline
        # The group is out of step now: later calls refuse at once rather than mismatch.
        with pytest.raises(shardckpt.DeadlineExceeded):
            shardckpt.save({"w": torch.ones(2)}, root, step=2, comm=late)
    barrier(comm)
    assert not os.path.exists(os.path.join(root, "step-000000001"))


def test_a_groups_own_shorter_timeout_is_said_as_such(comm, root, monkeypatch):
    """A group made with timeout=2 s times out before SHARDCKPT_COLLECTIVE_TIMEOUT_S (30 s): the
    message said "after 1800 s (SHARDCKPT_COLLECTIVE_TIMEOUT_S)" where 10 s had passed."""
    import datetime
    import re
    short = _group_with_a_deadline(comm, monkeypatch, "30", timeout=datetime.timedelta(seconds=2))
    outcome = _deadline_while_the_last_rank_sleeps(comm, 5, lambda: shardckpt.save({"w": torch.ones(2)}, root, step=1,
                                                                                     comm=short))
    if outcome:
        error, waited = outcome
        if waited < 20:  # the group's own timeout came first (not every torch applies it to gloo)
            assert "the process group's own timeout, before SHARDCKPT_COLLECTIVE_TIMEOUT_S=30 s" in \
                error.message, error.message
        else:
            assert "(SHARDCKPT_COLLECTIVE_TIMEOUT_S)" in error.message, error.message
        said = float(re.search(r"timed out after ([0-9.]+) s", error.message).group(1))
        assert abs(said - waited) < 3, (said, waited)
    barrier(comm)


def test_ctrl_c_on_one_rank_during_a_save_acts_after_it_commits(comm, root, monkeypatch):
    """Under torchrun the save's collectives run Python (gloo): Ctrl-C on one rank raised
    KeyboardInterrupt inside one, that rank left the save as Aborted, the others waited for it
    to exit, and nothing committed. It is held until the save returns, then raised."""
    import signal
    import torch.distributed as dist
    from shardckpt._torch_comm import TorchGroupComm
    if not dist.is_initialized() or comm.size < 2:
        pytest.skip("torch.distributed with 2 ranks or more")
    gloo = shardckpt.from_process_group(dist.new_group(backend="gloo"))
    if comm.rank == 1:
        run, sent = TorchGroupComm._run, []

        def interrupted_run(self, what, launch):  # the signal arrives inside the save's first collective
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)
            return run(self, what, launch)

        monkeypatch.setattr(TorchGroupComm, "_run", interrupted_run)
        with pytest.raises(KeyboardInterrupt) as stopped:
            shardckpt.save({"w": torch.ones(4)}, root, step=1, comm=gloo)
        assert "during the save of step 1, which committed" in str(stopped.value)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # A save that fails (the ranks disagree on a replicated tensor) with Ctrl-C held: the
        # KeyboardInterrupt still comes, from the failure, so a loop retrying failed saves stops.
        sent.clear()
        with pytest.raises(KeyboardInterrupt) as stopped:
            shardckpt.save({"w": torch.ones(5)}, root, step=2, comm=gloo)
        assert "during the save of step 2, which failed" in str(stopped.value)
        assert isinstance(stopped.value.__cause__, shardckpt.ShardckptError)
    else:
        shardckpt.save({"w": torch.ones(4)}, root, step=1, comm=gloo)
        with pytest.raises(shardckpt.ShardckptError):
            shardckpt.save({"w": torch.ones(4)}, root, step=2, comm=gloo)
    barrier(comm)
    assert os.path.exists(os.path.join(root, "step-000000001", "manifest.json"))


def test_a_rank_that_never_joins_the_first_async_save_is_a_deadline_not_a_hang(comm, root, monkeypatch):
    """The first async_save() makes the saver's own gloo group: torch's new_group waited for the
    absent rank for torch's timeout (30 minutes), past SHARDCKPT_COLLECTIVE_TIMEOUT_S."""
    late = _group_with_a_deadline(comm, monkeypatch)
    outcome = _deadline_while_the_last_rank_sleeps(
        comm, 6, lambda: shardckpt.async_save({"w": torch.ones(2)}, root, step=1, comm=late).wait())
    if outcome:
        error, waited = outcome
        assert "SHARDCKPT_COLLECTIVE_TIMEOUT_S" in error.message
        assert "rank %d never joined" % (comm.size - 1) in error.message, error.message
        assert waited < 6  # gave up at the deadline
    barrier(comm)
    assert not os.path.exists(os.path.join(root, "step-000000001"))


def test_async_save_on_disjoint_subgroups(comm, root):
    """Pipeline stages each saving on their own stage's group: the saver's gloo group was made
    by the stage's ranks alone and took the name the other stage's group had, so a stage joined
    the other's peers (connection refused, or a hang in new_group). Stage 0 comes late, as it
    did there, and each stage saves twice (a second saver with other retention)."""
    import time
    import torch.distributed as dist
    if not dist.is_initialized() or comm.size != 4:
        pytest.skip("torch.distributed with 4 ranks")
    if "use_local_synchronization" not in __import__("inspect").signature(dist.new_group).parameters:
        stage = dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")
        with pytest.raises(shardckpt.Unimplemented) as refused:  # torch 1.13: said so, at once
            shardckpt.async_save({"w": torch.ones(2)}, root, 1, comm=stage[comm.rank // 2])
        assert "only with torch >= 2.1" in refused.value.message
        assert "use save() on the subgroup, or async_save() on the default group" in refused.value.message
        return
    groups = dist.new_group([0, 1]), dist.new_group([2, 3])  # nccl-less: the default backend
    stage = comm.rank // 2
    mine = groups[stage]
    if stage == 0:
        time.sleep(2)
    where = os.path.join(root, "stage%d" % stage)
    for step, keep in ((1, 0), (2, 1)):
        state = {"w": torch.arange(10.0) + 100 * stage + step}
        shardckpt.async_save(state, where, step, comm=mine, keep_last=keep).wait()
        target = {"w": torch.zeros(10)}
        shardckpt.load(target, where, comm=mine)
        assert torch.equal(target["w"], torch.arange(10.0) + 100 * stage + step)
    barrier(comm)
