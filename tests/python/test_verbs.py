"""The command line's verbs from Python: inspect, verify, consolidate, import_checkpoint and
reshard. They are single-process functions; each rank works in a folder of its own, except the
reshard test, which loads the resharded checkpoint collectively at the job's world size."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("shardckpt._core")  # not built: skipped, exit 77 (conftest.py)
import shardckpt  # noqa: E402
from conftest import barrier


def sample():
    g = torch.Generator().manual_seed(3)
    return {
        "model": {"w": torch.randn(40, 30, generator=g), "b": torch.randn(30, generator=g),
                  "h": torch.randn(8, 4, generator=g).to(torch.bfloat16),
                  "n": torch.randint(0, 9, (6,), generator=g)},
        "epoch": 4,
    }


def mine(root, comm):
    """A checkpoint root of this rank's own, saved by this process alone."""
    path = os.path.join(root, "rank%d" % comm.rank)
    shardckpt.save(sample(), path, 1, comm=shardckpt.single_process())
    return path


def test_inspect_lists_entries(comm, root):
    info = shardckpt.inspect(mine(root, comm))
    assert info["step"] == 1 and info["world_size"] == 1
    entries = {e["name"]: e for e in info["entries"]}
    assert entries["model.w"]["dtype"] == "float32" and entries["model.w"]["shape"] == [40, 30]
    assert entries["model.h"]["dtype"] == "bfloat16" and entries["model.h"]["shape"] == [8, 4]
    assert entries["model.n"]["dtype"] == "int64"
    assert entries["model.w"]["bytes"] == 40 * 30 * 4
    assert [b["name"] for b in info["blobs"]] == ["epoch"]
    assert os.path.basename(info["checkpoint"]).startswith("step-")


def test_inspect_missing_raises_not_found(comm, root):
    with pytest.raises(shardckpt.NotFound):
        shardckpt.inspect(os.path.join(root, "nothing-here"))


def test_verify_good_and_flipped_byte(comm, root):
    path = mine(root, comm)
    report = shardckpt.verify(path)
    assert report.problems == [] and report.files >= 1 and report.bytes_checked > 0
    data = os.path.join(report.checkpoint, "rank-00000.bin")
    with open(data, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(shardckpt.DataLoss) as caught:
        shardckpt.verify(path)
    assert "rank-00000.bin" in caught.value.message
    problem = caught.value.problems[0]
    assert problem.file == "rank-00000.bin" and problem.offset == 0
    # Lists of names, tensors apart from values; the message names them as the CLI does.
    assert problem.entries and all(isinstance(n, str) for n in problem.entries) and isinstance(problem.blobs, list)
    assert "(%s)" % problem.holders in caught.value.message and problem.entries[0] in problem.holders


def test_consolidate_to_pt(comm, root, tmp_path):
    path = mine(root, comm)
    out = os.path.join(root, "rank%d.pt" % comm.rank)
    result = shardckpt.consolidate(path, out)
    assert result["files"] == [out] and result["entries"] == 4 and result["aliases"] == 0
    try:
        loaded = torch.load(out, weights_only=True)
    except TypeError:  # torch before 1.13 has no weights_only
        loaded = torch.load(out)
    # Nested as saved (the manifest's torch_paths), not "model.w" at the top.
    assert sorted(loaded) == ["epoch", "model"], list(loaded)
    for name, tensor in sample()["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name
    with pytest.raises(shardckpt.InvalidArgument):
        shardckpt.consolidate(path, out, format="numpy")
    # A cast in either spelling; floating entries only.
    for spelling in ("bf16", "bfloat16"):
        cast = os.path.join(root, "rank%d-%s.pt" % (comm.rank, spelling))
        shardckpt.consolidate(path, cast, dtype=spelling)
        loaded = torch.load(cast)
        assert loaded["model"]["w"].dtype == torch.bfloat16 and loaded["model"]["n"].dtype == torch.int64, spelling
        assert torch.equal(loaded["model"]["w"], sample()["model"]["w"].to(torch.bfloat16)), spelling
    with pytest.raises(shardckpt.InvalidArgument, match="dtype must be bf16, fp16 or fp32 .or bfloat16"):
        shardckpt.consolidate(path, out, dtype="int8")


def test_consolidate_takes_one_glob_as_a_string(comm, root):
    # list("model.*") was eight one-character globs, and "*" among them matched every entry:
    # include="model.*" wrote the epoch too, and exclude="model.*" wrote nothing.
    path = mine(root, comm)
    out = os.path.join(root, "rank%d-globs.pt" % comm.rank)
    shardckpt.consolidate(path, out, include="model.*", strip_prefix="model.")
    assert sorted(torch.load(out)) == ["b", "h", "n", "w"]
    shardckpt.consolidate(path, out, exclude="model.*")
    assert sorted(torch.load(out)) == ["epoch"]
    shardckpt.consolidate(path, out, include=["model.w", "model.b"], exclude=("model.b",))
    assert sorted(torch.load(out)) == ["model"] and sorted(torch.load(out)["model"]) == ["w"]
    shardckpt.consolidate(path, out, include=(g for g in ["model.b"]))  # any iterable of globs
    assert sorted(torch.load(out)) == ["model"] and sorted(torch.load(out)["model"]) == ["b"]
    with pytest.raises(shardckpt.InvalidArgument, match="include= takes globs as str, not int"):
        shardckpt.consolidate(path, out, include=["model.*", 3])
    with pytest.raises(shardckpt.InvalidArgument, match="exclude= takes a glob or a list of globs, not bytes"):
        shardckpt.consolidate(path, out, exclude=b"model.*")


def test_import_then_load(comm, root):
    os.makedirs(root, exist_ok=True)
    src = os.path.join(root, "rank%d-src.pt" % comm.rank)
    tensors = {k: v for k, v in sample()["model"].items()}
    torch.save(tensors, src)
    out = os.path.join(root, "rank%d-imported" % comm.rank)
    result = shardckpt.import_checkpoint(src, out, 1, layout="replicated")
    assert result["tensors"] == 4
    # The keys of `shardckpt import --json`, with the same values.
    written = os.path.join(out, "step-000000000")
    assert result["checkpoint"] == result["out"] == result["path"] == written, result
    assert result["source"] == src and result["step"] == 0 and result["world_size"] == 1, result
    assert result["layout"] == "replicated" and result["tensor_bytes"] == result["bytes"] > 0, result
    into = {k: torch.zeros_like(v) for k, v in tensors.items()}
    shardckpt.load(into, out, comm=shardckpt.single_process())
    for k in tensors:
        assert torch.equal(into[k], tensors[k]), k


def test_reshard_then_load_at_new_world_size(comm, root):
    """Saved by one process, resharded (flat) for the job's world size, loaded by every rank
    into FlatShards of that layout."""
    src = os.path.join(root, "single")
    out = os.path.join(root, "resharded")
    state = sample()
    if comm.rank == 0:
        shardckpt.save(state, src, 1, comm=shardckpt.single_process())
        result = shardckpt.reshard(src, out, comm.size, layout="flat")
        assert result["tensors"] == 4 and result["skipped"] == [] and result["values"] == ["epoch"], result
    barrier(comm)
    info = shardckpt.inspect(out)
    assert info["world_size"] == comm.size
    into = {"model": {}, "epoch": -1}
    for name, tensor in state["model"].items():
        flat = tensor.reshape(-1)
        per = -(-flat.numel() // comm.size)
        begin = min(comm.rank * per, flat.numel())
        end = min(begin + per, flat.numel())
        into["model"][name] = shardckpt.FlatShard(torch.zeros(end - begin, dtype=tensor.dtype),
                                                  list(tensor.shape), begin)
    shardckpt.load(into, out, comm=comm)
    assert into["epoch"] == 4
    for name, tensor in state["model"].items():
        shard = into["model"][name]
        expected = tensor.reshape(-1)[shard.begin:shard.begin + shard.local.numel()]
        assert torch.equal(shard.local, expected), name


def test_reshard_to_more_ranks_than_the_soft_open_file_limit(comm, root):
    """Every output rank's file is written at once: under a soft limit of 64 open files a
    reshard to 200 ranks needs the soft limit raised to the hard one, as the CLI does."""
    import resource
    import subprocess
    import sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip("hard open-file limit %d is below what 200 ranks need" % hard)
    path = mine(root, comm)
    out = os.path.join(root, "wide%d" % comm.rank)
    script = ("import resource, sys, shardckpt\n"
              "resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
              "r = shardckpt.reshard(sys.argv[1], sys.argv[2], 200)\n"
              "print(r['tensors'])\n")
    done = subprocess.run([sys.executable, "-c", script, path, out], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"
    assert shardckpt.inspect(out)["world_size"] == 200


def test_cli_says_when_a_glob_names_something_inside_a_value_saved_whole(comm, root):
    # save stores a dict of plain values (a GradScaler's state) as one value: a glob naming one of
    # its leaves matched nothing, and the output silently lacked it.
    import subprocess
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(shardckpt.__file__))), "..", "bin",
                       "shardckpt")
    if not os.path.exists(cli):
        pytest.skip("the shardckpt tool is not built next to the package")
    path = os.path.join(root, "rank%d" % comm.rank)
    shardckpt.save({"scaler": {"scale": 65536.0, "n": 0}, "w": torch.ones(1)}, path, 1, comm=shardckpt.single_process())
    out = path + ".pt"
    done = subprocess.run([cli, "consolidate", path, "--out", out, "--include", "scaler.scale", "--include", "w"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--include 'scaler.scale' matches no entry or value; 'scaler' is one value, saved whole: select it as " \
        "'scaler'" in done.stderr, done.stderr
    assert sorted(torch.load(out)) == ["w"]


def test_cli_json_with_a_path_that_is_not_utf8(comm, root):
    """A folder name need not be UTF-8: every --json object still prints, its bad bytes as
    U+FFFD, and prune's output comes after its work as usual (it used to abort after deleting)."""
    import json
    import subprocess
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(shardckpt.__file__))), "..", "bin",
                       "shardckpt")
    if not os.path.exists(cli):
        pytest.skip("the shardckpt tool is not built next to the package")
    base = os.fsencode(os.path.join(root, "rank%d" % comm.rank))
    for step in (1, 2):
        shardckpt.save(sample(), base.decode(), step, comm=shardckpt.single_process())
    bad = base + b"-\xff"
    os.rename(base, bad)

    def run(*args):
        done = subprocess.run([cli, *args, "--json"], capture_output=True, timeout=120)
        return done.returncode, json.loads(done.stdout.decode("utf-8"))

    rc, listed = run("list", bad)
    assert rc == 0 and [c["name"] for c in listed["checkpoints"]] == ["step-000000001", "step-000000002"], listed
    assert listed["root"].endswith("-\ufffd"), listed["root"]
    rc, info = run("inspect", bad)
    assert rc == 0 and info["step"] == 2, info
    rc, checked = run("verify", bad)
    assert rc == 0 and checked["ok"], checked
    rc, pruned = run("prune", bad, "--keep-last", "1")
    assert rc == 0 and pruned["removed"] == ["step-000000001"], pruned
    assert sorted(n for n in os.listdir(bad) if n.startswith(b"step-")) == [b"step-000000002"]
    rc, failed = run("inspect", bad + b"/nothing")
    assert rc == 1 and failed["ok"] is False and failed["error"]["code"] == "NotFound", failed


def test_cli_prune_of_a_read_only_root(comm, root):
    """On a read-only file system prune cannot make its lock: a rule that removes nothing
    succeeds, one that would remove something says so (it failed on the lock file either way)."""
    import json
    import subprocess
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(shardckpt.__file__))), "..", "bin",
                       "shardckpt")
    if not os.path.exists(cli):
        pytest.skip("the shardckpt tool is not built next to the package")
    own = os.path.join(root, "rank%d" % comm.rank)
    for step in (1, 2, 3):
        shardckpt.save(sample(), own, step, comm=shardckpt.single_process())
    mounted = own + "-ro"
    os.makedirs(mounted)
    bind = subprocess.run(["mount", "--bind", own, mounted], capture_output=True)
    if bind.returncode != 0:
        pytest.skip("no bind mount here (%s)" % bind.stderr.decode().strip())
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", mounted], capture_output=True).returncode != 0:
            pytest.skip("no read-only remount here")

        def run(*args):
            done = subprocess.run([cli, *args, "--json"], capture_output=True, timeout=120)
            return done.returncode, json.loads(done.stdout.decode("utf-8"))

        rc, kept = run("prune", mounted, "--keep-last", "3")
        assert rc == 0 and kept["ok"] and kept["removed"] == [] and kept["failed"] == [], kept
        rc, refused = run("prune", mounted, "--keep-last", "1")
        assert rc == 1 and refused["error"]["code"] == "FailedPrecondition", refused
        assert "is on a read-only file system: the rule would remove 2 folder(s)" in refused["error"]["message"]
    finally:
        subprocess.run(["umount", mounted], capture_output=True)
    assert sorted(n for n in os.listdir(own) if n.startswith("step-")) == [
        "step-000000001", "step-000000002", "step-000000003"]


def test_cli_a_step_folder_holding_someones_files_is_left_by_list_dry_run_and_prune(comm, root):
    """A step folder without a manifest is a dead save's or deletion's leftover, removed, unless
    it holds files no save writes: list, prune --dry-run and prune all say it is left, and why
    (NFS's .nfsXXXX files do not count). Left by design, it fails no prune: a cron job's prune
    would otherwise fail for as long as the folder stays."""
    import json
    import subprocess
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(shardckpt.__file__))), "..", "bin",
                       "shardckpt")
    if not os.path.exists(cli):
        pytest.skip("the shardckpt tool is not built next to the package")
    own = os.path.join(root, "rank%d" % comm.rank)
    for step in (1, 2):
        shardckpt.save(sample(), own, step, comm=shardckpt.single_process())
    notes, dead = os.path.join(own, "step-000000001"), os.path.join(own, "step-000000007")
    os.remove(os.path.join(notes, "manifest.json"))
    open(os.path.join(notes, "NOTES.txt"), "w").write("mine")
    os.makedirs(dead)
    for name in ("rank-00000.bin", ".nfs000000000001"):
        open(os.path.join(dead, name), "w").write("x")

    def run(*args):
        done = subprocess.run([cli, *args, "--json"], capture_output=True, timeout=120)
        return done.returncode, json.loads(done.stdout.decode("utf-8"))

    rc, listed = run("list", own)
    rows = {c["name"]: c for c in listed["checkpoints"]}
    assert rc == 0 and rows["step-000000001"]["retention"] == "left: holds NOTES.txt, which no save writes", rows
    assert rows["step-000000007"]["retention"] == "next save removes", rows
    text = subprocess.run([cli, "list", own], capture_output=True, text=True, timeout=120).stdout
    assert "no manifest, and holds NOTES.txt, which no save writes" in text, text
    # A dry run, the prune that removes the dead save's folder, and one after it with nothing to do.
    for flags, removed in ((["--dry-run"], ["step-000000007"]), ([], ["step-000000007"]), ([], [])):
        done = subprocess.run([cli, "prune", own, "--keep-last", "5", "--json", *flags], capture_output=True,
                              timeout=120)
        pruned = json.loads(done.stdout.decode("utf-8"))
        assert done.returncode == 0 and pruned["ok"] and pruned["failed"] == [], pruned
        assert pruned["removed"] == removed, pruned
        assert [f["folder"] for f in pruned["left_alone"]] == ["step-000000001"], pruned
        assert "holds NOTES.txt, which no save writes" in pruned["left_alone"][0]["message"], pruned
        named = os.fsencode(notes) + b" has no manifest but holds NOTES.txt"
        assert done.stderr.count(named) == 1, done.stderr  # once: the dry run's line, or the cleanup's
    assert open(os.path.join(notes, "NOTES.txt")).read() == "mine" and not os.path.exists(dead)


def test_verbs_with_a_path_that_is_not_utf8(comm, root):
    """Paths are bytes to the engine: a folder name that is not UTF-8, given as bytes, as
    os.fsdecode's str or as a pathlib.Path, works in every verb, and the paths that come back
    (and those inside messages) are os.fsdecode's, so they can be passed back in."""
    import pathlib
    bad = os.fsencode(os.path.join(root, "rank%d" % comm.rank)) + b"-\xff"
    one = shardckpt.single_process()
    saved = shardckpt.save(sample(), bad, 1, comm=one)
    assert os.fsencode(saved.path) == bad + b"/step-000000001", saved.path
    shardckpt.save(sample(), pathlib.Path(os.fsdecode(bad)), 2, comm=one)

    state = {"model": {k: torch.zeros_like(v) for k, v in sample()["model"].items()}, "epoch": 0}
    report = shardckpt.load(state, os.fsdecode(bad), comm=one)
    assert report.path == saved.path.replace("000000001", "000000002")
    assert torch.equal(state["model"]["w"], sample()["model"]["w"]) and state["epoch"] == 4

    info = shardckpt.inspect(report.path)  # a path that came back goes back in
    assert info["checkpoint"] == report.path and info["step"] == 2
    assert shardckpt.verify(bad).problems == []
    out = bad + b"/model-\xfe.pt"
    made = shardckpt.consolidate(bad, out)
    assert [os.fsencode(f) for f in made["files"]] == [out]
    with open(out, "rb") as f:  # torch 1.13's load takes no bytes path
        assert torch.equal(torch.load(f)["model"]["w"], sample()["model"]["w"])
    moved = shardckpt.reshard(bad, bad + b"-r3", 3)
    assert os.fsencode(moved["path"]).startswith(bad + b"-r3/step-"), moved
    assert shardckpt.inspect(bad + b"-r3")["world_size"] == 3
    imported = shardckpt.import_checkpoint(out, bad + b"-imp", 2)
    assert shardckpt.inspect(imported["path"])["world_size"] == 2

    with pytest.raises(shardckpt.NotFound) as caught:
        shardckpt.inspect(bad + b"/nothing")
    assert os.fsdecode(bad + b"/nothing") in str(caught.value), str(caught.value)
