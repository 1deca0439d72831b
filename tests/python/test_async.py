"""async_save: the snapshot is taken at call time, and a failed persist raises the same typed
exception on every rank from wait(). Under mpirun (MPI_THREAD_MULTIPLE) and under torchrun (the
persist runs on a gloo group of its own)."""

import hashlib
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("shardckpt._core")  # not built: skipped, exit 77 (conftest.py)
import shardckpt  # noqa: E402
from shardckpt import _core  # noqa: E402
from conftest import barrier



def state_at(comm, seed):
    """Replicated tensors drawn first (the same on every rank), then this rank's flat shard."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 33, generator=g)
    i = torch.randint(0, 1000, (17,), generator=g)
    local = torch.randn(1000 + comm.rank, generator=g) + comm.rank
    total = sum(1000 + r for r in range(comm.size))
    begin = sum(1000 + r for r in range(comm.rank))
    return {"w": w, "i": i, "shard": shardckpt.FlatShard(local, [total], begin), "step": seed}


def clone(state):
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.clone()
        elif isinstance(v, shardckpt.FlatShard):
            out[k] = shardckpt.FlatShard(v.local.clone(), v.global_shape, v.begin)
        else:
            out[k] = v
    return out


def zeroed(state):
    out = clone(state)
    for k, v in out.items():
        if isinstance(v, torch.Tensor):
            v.zero_()
        elif isinstance(v, shardckpt.FlatShard):
            v.local.zero_()
        else:
            out[k] = -1
    return out


def assert_same(a, b):
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, shardckpt.FlatShard):
            x, y = x.local, y.local
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), k
        else:
            assert x == y, k


def test_values_at_call_time(comm, root):
    state = state_at(comm, 5)
    expected = clone(state)
    handle = shardckpt.async_save(state, root, 5, comm=comm)
    assert handle.step == 5
    # The training loop changes every tensor in place right away (DCP issue 144657).
    with torch.no_grad():
        for v in state.values():
            t = v.local if isinstance(v, shardckpt.FlatShard) else v
            if isinstance(t, torch.Tensor):
                t.fill_(7)
    handle.wait()
    assert handle.done()
    handle.wait()  # callable again
    into = zeroed(expected)
    report = shardckpt.load(into, root, comm=comm)
    assert report.step == 5
    assert_same(into, expected)


def test_saver_reused_across_saves(comm, root):
    handles = []
    states = []
    for step in (1, 2, 3):
        state = state_at(comm, step)
        states.append(clone(state))
        handles.append(shardckpt.async_save(state, root, step, comm=comm))
    for h in handles:
        h.wait()
    for step, expected in zip((1, 2, 3), states):
        into = zeroed(expected)
        path = [c for c in os.listdir(root) if c.startswith("step-") and int(c[5:]) == step]
        shardckpt.load(into, os.path.join(root, path[0]), comm=comm)
        assert_same(into, expected)


def test_a_save_after_an_async_save_waits_for_it(comm, root):
    """A final synchronous save right after a periodic async one, into the same root: one of
    the two found the root locked by the other and failed ("two jobs must not save into one
    root"), sometimes the async one, after its handle had been returned."""
    state = state_at(comm, 1)
    first = clone(state)
    for _ in range(3):  # a timing: tried a few times, each in a fresh root
        here = os.path.join(root, "try%d" % _)
        handle = shardckpt.async_save(state, here, 1, comm=comm)
        second = clone(state_at(comm, 2))
        saved = shardckpt.save(second, here, 2, comm=comm)
        assert saved.path.endswith("step-000000002")
        handle.wait()
        for step, expected in ((1, first), (2, second)):
            into = zeroed(expected)
            report = shardckpt.load(into, os.path.join(here, "step-%09d" % step), comm=comm)
            assert report.step == step
            assert_same(into, expected)


def assert_same_everywhere(comm, error):
    """The same exception class and message on every rank (agree() carries failures only, so
    each rank sends a short token of its own; ranks that send the same one are named together,
    so one cause for every rank means every rank raised the same)."""
    token = "%s/%s" % (type(error).__name__, hashlib.sha1(error.message.encode()).hexdigest()[:16])
    code, message, _ = comm.agree("Internal", token)
    everyone = "ranks 0-%d" % (comm.size - 1) if comm.size > 1 else "rank 0"
    assert message == "%s: %s" % (everyone, token), message


def test_injected_failure_raises_everywhere(comm, root):
    code, message, _ = _core.set_failpoints("save.write_data@%d=EIO" % (comm.size - 1))
    assert code == "OK", message
    try:
        handle = shardckpt.async_save(state_at(comm, 9), root, 9, comm=comm)
        with pytest.raises(shardckpt.IoError) as first:
            handle.wait()
        with pytest.raises(shardckpt.IoError) as again:
            handle.wait()
        assert str(first.value) == str(again.value)
        assert "rank-%05d.bin" % (comm.size - 1) in first.value.message
        assert handle.done()
    finally:
        _core.set_failpoints("")
    assert_same_everywhere(comm, first.value)
    # The next save through the same saver works.
    state = state_at(comm, 10)
    expected = clone(state)
    shardckpt.async_save(state, root, 10, comm=comm).wait()
    into = zeroed(expected)
    shardckpt.load(into, root, comm=comm)
    assert_same(into, expected)


def test_unwritable_root_raises_everywhere(comm, root):
    blocker = root + "-file"  # a file where the root's parent folder should be
    if comm.rank == 0:
        os.makedirs(os.path.dirname(blocker), exist_ok=True)
        with open(blocker, "w") as f:
            f.write("not a folder")
    barrier(comm)
    handle = shardckpt.async_save(state_at(comm, 1), os.path.join(blocker, "ckpt"), 1, comm=comm)
    with pytest.raises(shardckpt.ShardckptError) as caught:
        handle.wait()
    assert blocker in caught.value.message
    assert_same_everywhere(comm, caught.value)


def test_process_group_gets_one_saver(comm, root):
    """Under torchrun, passing the process group itself reuses one saver across calls."""
    import torch.distributed as dist
    if not dist.is_initialized():
        pytest.skip("torch.distributed only")
    from shardckpt import _savers
    shardckpt.async_save(state_at(comm, 1), root, 1, comm=dist.group.WORLD).wait()
    before = len(_savers)
    shardckpt.async_save(state_at(comm, 2), root, 2, comm=dist.group.WORLD).wait()
    assert len(_savers) == before


def test_saves_with_other_options_wait_and_share_one_saver(comm, root):
    """A job that keeps the best checkpoints only on evaluation steps, and records the epoch in
    each save's metadata: every save waits for the one before (a second saver made for the other
    options wrote beside the first's persist, and one save failed on every rank), and the savers,
    staging areas and groups do not grow with the number of distinct options."""
    from shardckpt import _savers
    code, message, _ = _core.set_failpoints("save.write_data=sleep:200")  # each persist is in flight
    assert code == "OK", message
    handles = []
    try:
        for step in range(1, 7):
            if step % 2 == 0:
                handles.append(shardckpt.async_save(
                    state_at(comm, step), root, step, comm=comm, keep_last=2, keep_best=1,
                    best_metric="val_loss", metrics={"val_loss": 1.0 / step}, user_metadata={"epoch": str(step)}))
            else:
                handles.append(shardckpt.async_save(state_at(comm, step), root, step, comm=comm, keep_last=2,
                                                    user_metadata={"epoch": str(step)}))
            if step == 1:
                savers = len(_savers)
        for handle in handles:
            handle.wait()
    finally:
        _core.set_failpoints("")
    assert len(_savers) == savers
    # The last save's policy (keep the newest 2) ran after it: steps 5 and 6.
    assert sorted(saved_steps(root)) == [5, 6]
    for step in (5, 6):
        info = shardckpt.inspect(os.path.join(root, "step-%09d" % step))
        assert info["created"]["user"]["epoch"] == str(step), info["created"]["user"]
    got = zeroed(state_at(comm, 6))
    shardckpt.load(got, root, comm=comm)
    assert_same(got, state_at(comm, 6))


# ---- Copy while training: async_save(..., copy_while_training=True) returns before the copy;
# fence() waits for it.

def saved_steps(root):
    """step -> [folder name] of the checkpoints under root."""
    if not os.path.isdir(root):
        return {}
    return {int(c[5:]): [c] for c in os.listdir(root) if c.startswith("step-")}


def test_copy_while_training_saves_values_at_call_time(comm, root):
    state = state_at(comm, 21)
    expected = clone(state)
    # The copy starts 300 ms late: a fence that did not wait for it would let the mutation below
    # reach the checkpoint.
    code, message, _ = _core.set_failpoints("async.snapshot=sleep:300")
    assert code == "OK", message
    try:
        handle = shardckpt.async_save(state, root, 21, comm=comm, copy_while_training=True)
        # The forward/backward pass reads the tensors while the copy runs.
        total = sum(float(v.sum()) for v in state.values() if isinstance(v, torch.Tensor))
        assert total == sum(float(v.sum()) for v in expected.values()
                            if isinstance(v, torch.Tensor))
        waited = handle.fence()
    finally:
        _core.set_failpoints("")
    assert 0.1 < waited and handle.fence_seconds == waited
    assert handle.fence() == waited  # again: at once, the same figure
    # The optimizer step changes every tensor in place right after the fence.
    with torch.no_grad():
        for v in state.values():
            t = v.local if isinstance(v, shardckpt.FlatShard) else v
            if isinstance(t, torch.Tensor):
                t.fill_(7)
    state["step"] = 99
    handle.wait()
    assert handle.done()
    into = zeroed(expected)
    report = shardckpt.load(into, root, comm=comm)
    assert report.step == 21
    assert_same(into, expected)


def test_copy_while_training_back_to_back(comm, root):
    """A second save without a fence first takes the first one's snapshot; both are kept."""
    states, handles = [], []
    for step in (31, 32):
        state = state_at(comm, step)
        states.append(clone(state))
        handles.append(shardckpt.async_save(state, root, step, comm=comm,
                                            copy_while_training=True))
    handles[1].fence()
    for h in handles:
        h.wait()
        h.fence()  # after wait: returns at once
    for step, expected in zip((31, 32), states):
        into = zeroed(expected)
        shardckpt.load(into, os.path.join(root, *saved_steps(root)[step]), comm=comm)
        assert_same(into, expected)


def test_copy_while_training_failure_raised_by_fence_everywhere(comm, root):
    # The copy fails on the last rank only; every rank's fence() raises it.
    code, message, _ = _core.set_failpoints("async.snapshot@%d=EIO" % (comm.size - 1))
    assert code == "OK", message
    try:
        handle = shardckpt.async_save(state_at(comm, 41), root, 41, comm=comm,
                                      copy_while_training=True)
        with pytest.raises(shardckpt.IoError) as first:
            handle.fence()
        with pytest.raises(shardckpt.IoError) as again:
            handle.wait()
        assert str(first.value) == str(again.value)
        assert "snapshot of step 41" in first.value.message
        assert "rank %d" % (comm.size - 1) in first.value.message
    finally:
        _core.set_failpoints("")
    assert_same_everywhere(comm, first.value)
    assert 41 not in saved_steps(root)
    # The next copy-while-training save through the same saver works.
    state = state_at(comm, 42)
    expected = clone(state)
    h = shardckpt.async_save(state, root, 42, comm=comm, copy_while_training=True)
    h.fence()
    h.wait()
    into = zeroed(expected)
    assert shardckpt.load(into, root, comm=comm).step == 42
    assert_same(into, expected)


def test_a_failed_copy_is_still_raised_by_fence_after_a_save_waited_for_it(comm, root):
    # save() waits for the job's saves in flight; the copy-while-training handle not fenced yet
    # must still raise its failed copy from fence() afterwards (it returned 0.0, no error).
    code, message, _ = _core.set_failpoints("async.snapshot=EIO")
    assert code == "OK", message
    try:  # the copy runs in the background: the failpoint stays until save() has waited for it
        handle = shardckpt.async_save(state_at(comm, 51), root, 51, comm=comm, copy_while_training=True)
        saved = shardckpt.save(state_at(comm, 52), root, 52, comm=comm)
    finally:
        _core.set_failpoints("")
    assert saved.path.endswith("step-000000052")
    with pytest.raises(shardckpt.IoError) as failed:
        handle.fence()
    assert "snapshot of step 51" in failed.value.message
    with pytest.raises(shardckpt.IoError):
        handle.wait()
    assert 51 not in saved_steps(root)


def test_a_failed_copy_is_still_raised_by_fence_after_a_plain_async_save(comm, root):
    # A plain async_save on the same saver waits for the unfenced copy the same way.
    code, message, _ = _core.set_failpoints("async.snapshot#1=EIO")
    assert code == "OK", message
    try:
        handle = shardckpt.async_save(state_at(comm, 61), root, 61, comm=comm, copy_while_training=True)
        shardckpt.async_save(state_at(comm, 62), root, 62, comm=comm).wait()
    finally:
        _core.set_failpoints("")
    with pytest.raises(shardckpt.IoError) as failed:
        handle.fence()
    assert "snapshot of step 61" in failed.value.message
    assert list(saved_steps(root)) == [62]


_UNSEEN_SCRIPT = r'''
import atexit, sys, torch, shardckpt
from shardckpt import _core
root, mode = sys.argv[1], sys.argv[2]
out = open(root + ".csv", "w")  # never closed: the interpreter's teardown flushes it
out.write("row\n" * 5)
atexit.register(lambda: print("user handler ran", flush=True))
one = shardckpt.single_process()
_core.set_failpoints("save.write_data#1=ENOSPC")
state = {"w": torch.ones(4)}
if mode == "exit75":  # dropped unwaited, then the script exits with a code of its own
    shardckpt.async_save(state, root, step=1, comm=one)
    sys.exit(75)
if mode == "fence":  # the failure raised by fence() is seen
    _core.set_failpoints("async.snapshot#1=EIO")
    h = shardckpt.async_save(state, root, step=1, comm=one, copy_while_training=True)
    try:
        h.fence()
    except shardckpt.IoError:
        print("fence raised", flush=True)
if mode == "wait_old":  # the first handle waited for after the second save started
    h1 = shardckpt.async_save(state, root, step=1, comm=one)
    h2 = shardckpt.async_save(state, root, step=2, comm=one)
    try:
        h1.wait()
    except shardckpt.NoSpace:
        print("h1 raised", flush=True)
    h2.wait()
if mode == "sync_after":  # dropped unwaited, then a synchronous save
    shardckpt.async_save(state, root, step=1, comm=one)
    print("before", flush=True)
    shardckpt.save(state, root, step=2, comm=one)
    print("after", flush=True)
if mode == "copy_dropped":  # a failed snapshot copy, its handle dropped: the next save fences it
    _core.set_failpoints("async.snapshot#1=EIO")
    shardckpt.async_save(state, root, step=1, comm=one, copy_while_training=True)
    shardckpt.async_save(state, root, step=2, comm=one).wait()
    print("after", flush=True)
if mode == "waited_dropped":  # wait() raised, then the handle is dropped before the next save
    h = shardckpt.async_save(state, root, step=1, comm=one)
    try:
        h.wait()
    except shardckpt.NoSpace:
        print("wait raised", flush=True)
    del h
    shardckpt.save(state, root, step=2, comm=one)
    print("after", flush=True)
'''


@pytest.mark.parametrize("mode,code,logged", [("exit75", 75, True), ("fence", 0, False),
                                              ("wait_old", 0, False), ("sync_after", 0, True),
                                              ("waited_dropped", 0, False), ("copy_dropped", 0, True)])
def test_a_failure_no_caller_saw_is_logged_once_and_the_exit_is_the_scripts(comm, root, tmp_path, mode, code,
                                                                             logged):
    """A failed async save whose handle was dropped is logged (at the next save, or at exit),
    never when wait() or fence() gave the caller its error; the script's exit status, its other
    exit handlers and its unflushed files are left alone."""
    import subprocess
    import sys
    if comm.rank != 0:
        return
    script = tmp_path / "unseen.py"
    script.write_text(_UNSEEN_SCRIPT)
    target = str(tmp_path / mode)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(shardckpt.__file__)),
                                                                   os.environ.get("PYTHONPATH", "")] if p))
    env.pop("SHARDCKPT_FAILPOINTS", None)
    done = subprocess.run([sys.executable, str(script), target, mode], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=240, env=env)  # one stream, in order
    output = done.stdout
    assert done.returncode == code, output
    assert "user handler ran" in output and open(target + ".csv").read() == "row\n" * 5, output
    lines = [line for line in output.splitlines() if "no wait() saw it" in line]
    assert len(lines) == (1 if logged else 0), output
    if logged:
        code_logged = "IoError" if mode == "copy_dropped" else "NoSpace"
        assert "the async save of step 1 failed, and no wait() saw it: " + code_logged in lines[0], output
    if mode == "sync_after":  # logged at the save that followed, not only at exit
        assert output.index("no wait() saw it") < output.index("after"), output
