"""Our checkpoints exported to PyTorch DCP folders and read back by torch 2.x itself, and
consolidated to GGUF and read back by the gguf package (run_case.sh phases, torch2 venv):
SHARDCKPT_PY_PHASE=save at 2 torchrun ranks saves (flat shards through the Python package; boxes
through the C++ importer) and exports; =load at 3 torchrun ranks dcp.loads into DTensor Shard(0)
and Shard(1) targets and plain tensors, converts with dcp_to_torch_save, and checks the GGUF
files."""

import glob
import json
import math
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("shardckpt._core")  # not built: skipped, exit 77 (conftest.py)
import shardckpt  # noqa: E402

PHASE = os.environ.get("SHARDCKPT_PY_PHASE", "")
WORK = os.environ.get("SHARDCKPT_PY_WORK", "/tmp/shardckpt-pytest")
# name -> (shape, dtype): flat shards saved by the Python package at 2 ranks (uneven splits),
# and a replicated tensor.
FLAT = {"params.w": ((13, 7), torch.bfloat16), "params.b": ((5,), torch.float32),
        "params.e": ((4, 3, 5), torch.float32), "params.f8": ((3, 5), torch.float8_e4m3fn)}
REPLICATED = {"idx": ((6,), torch.int64)}
# Boxes: a .pt imported at 2 ranks with the dim-0 layout (7 rows: 4 + 3), and a 0-d tensor.
BOX = {"w": ((7, 3), torch.bfloat16), "b": ((5,), torch.float32), "i": ((5, 2), torch.int64),
       "s": ((), torch.float32)}
META = {"lr": 0.5, "name": "run-1", "sizes": (1, 2), "tags": ["a", None, True], "raw": b"\x00\xff"}


def full(name, shape, dtype):
    """Distinct values, exact in every dtype used (bf16 has 8 significant bits)."""
    numel = math.prod(shape)
    base = sum(map(ord, name)) % 17
    if dtype == torch.int64:
        return ((torch.arange(numel, dtype=torch.int64) + base) * 1000000007 * 1000).reshape(shape)
    return (((torch.arange(numel) + base) % 200 - 100) * 0.5).to(dtype).reshape(shape)


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def cli():
    """The command-line tool built next to the extension (build/bin/shardckpt)."""
    core = os.path.dirname(os.path.dirname(os.path.abspath(shardckpt._core.__file__)))
    path = os.path.join(os.path.dirname(core), "bin", "shardckpt")
    assert os.path.exists(path), path
    return path


def expected_flat():
    out = {n: full(n, s, d) for n, (s, d) in {**FLAT, **REPLICATED}.items()}
    return out


@pytest.mark.skipif(PHASE != "save", reason="save phase only")
def test_save_and_export(comm):
    params = {}
    for name, (shape, dtype) in FLAT.items():
        flat = full(name, shape, dtype).reshape(-1)
        per = -(-flat.numel() // comm.size)
        begin = min(comm.rank * per, flat.numel())
        end = min(begin + per, flat.numel())
        params[name.split(".", 1)[1]] = shardckpt.FlatShard(flat[begin:end].clone(), shape, begin)
    state = {"params": params, "idx": full("idx", *REPLICATED["idx"]), "step": 42, "meta": META,
             "rng": shardckpt.PerRank(torch.full((3,), comm.rank, dtype=torch.uint8))}
    saved = shardckpt.save(state, os.path.join(WORK, "flat"), step=42)
    if comm.rank == 0:
        pt = os.path.join(WORK, "box.pt")
        torch.save({n: full(n, s, d) for n, (s, d) in BOX.items()}, pt)
        box = shardckpt.import_checkpoint(pt, os.path.join(WORK, "box"), 2, "dim0")
        report = shardckpt.export(saved.path, os.path.join(WORK, "dcp_flat"))
        assert report["tensors"] == 5 and report["byte_items"] == 2, report
        assert [s[:39] for s in report["skipped"]] == ["rng: a per-rank value (saved by rank %d)" % r
                                                       for r in (0, 1)], report["skipped"]
        # Flat shards become the boxes they cover: (13, 7) split 46 + 45 is 3 + 2 boxes.
        assert report["chunks"] >= 7, report
        report = shardckpt.export(box["path"], os.path.join(WORK, "dcp_box"))
        assert report["tensors"] == 4 and report["chunks"] == 7 and report["skipped"] == [], report
        # Windows of 8 bytes: every chunk is read and written in pieces (runs of one dim, single
        # indices of the dims before it), and must come out the same.
        report = shardckpt.export(box["path"], os.path.join(WORK, "dcp_box_small"), window_bytes=8)
        assert report["chunks"] == 7, report
        report = shardckpt.export(saved.path, os.path.join(WORK, "dcp_flat_small"), window_bytes=8)
        # A damaged checkpoint is refused naming the entry (every block read is checked), and
        # the folder has no .metadata: DCP sees no checkpoint there.
        import shutil
        damaged = os.path.join(WORK, "damaged")
        shutil.copytree(box["path"], damaged)
        with open(os.path.join(damaged, "rank-00001.bin"), "r+b") as f:
            f.seek(5)
            byte = f.read(1)
            f.seek(5)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(shardckpt.DataLoss, match=r"entry '\w+': .*checksum mismatch"):
            shardckpt.export(damaged, os.path.join(WORK, "dcp_damaged"))
        assert not os.path.exists(os.path.join(WORK, "dcp_damaged", ".metadata"))
        # An existing, non-empty folder is never written into.
        with pytest.raises(shardckpt.InvalidArgument, match="is not empty"):
            shardckpt.export(box["path"], os.path.join(WORK, "dcp_box"))


@pytest.mark.skipif(PHASE != "save", reason="save phase only")
def test_every_dtype_exports(comm):
    """The dtypes the .pt importer takes, each as a typed storage DCP's torch.load rebuilds."""
    import torch.distributed.checkpoint as dcp
    if comm.rank != 0:
        return
    dtypes = [torch.float64, torch.float16, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    ref = {str(d).split(".")[1]: (torch.arange(12) % 5 - 2).to(d).reshape(4, 3) for d in dtypes}
    pt = os.path.join(WORK, "dtypes.pt")
    torch.save(ref, pt)
    ck = shardckpt.import_checkpoint(pt, os.path.join(WORK, "dtypes"), 2, "dim0")
    shardckpt.export(ck["path"], os.path.join(WORK, "dcp_dtypes"))
    got = {k: torch.ones_like(v) for k, v in ref.items()}
    dcp.load(got, checkpoint_id=os.path.join(WORK, "dcp_dtypes"), no_dist=True)
    for k, v in ref.items():
        assert same(got[k], v), k


def dcp_load_cases():
    box = {n: full(n, s, d) for n, (s, d) in BOX.items()}
    return [("dcp_flat", expected_flat()), ("dcp_box", box), ("dcp_flat_small", expected_flat()),
            ("dcp_box_small", box)]


@pytest.mark.skipif(PHASE != "load", reason="load phase only")
def test_dcp_load_into_dtensors_and_plain_tensors(comm):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    assert dist.is_initialized() and dist.get_world_size() == 3
    mesh = init_device_mesh("cpu", (3,))

    def rows_of(v):  # this rank's Shard(0) rows: torch.chunk's split, empty past the last chunk
        rows = torch.chunk(v, 3, dim=0)
        return rows[comm.rank] if comm.rank < len(rows) else v[0:0]

    def cols_of(v):
        cols = torch.chunk(v, 3, dim=1)
        return (cols[comm.rank] if comm.rank < len(cols) else v[:, 0:0]).contiguous()

    for folder, expected in dcp_load_cases():
        # from_local: no collective to build them (gloo has no float8).
        sharded = {n: DTensor.from_local(torch.zeros_like(rows_of(v)), mesh, [Shard(0)], run_check=False,
                                         shape=v.shape, stride=v.stride()) if v.dim() > 0
                   else torch.zeros_like(v) for n, v in expected.items()}
        nested = {}  # DCP flattens nesting to dotted names, as our names are
        for n, v in sharded.items():
            head, _, tail = n.partition(".")
            if tail:
                nested.setdefault(head, {})[tail] = v
            else:
                nested[n] = v
        if folder.startswith("dcp_flat"):
            nested["step"], nested["meta"] = 0, {}
        dcp.load(nested, checkpoint_id=os.path.join(WORK, folder))
        for n, v in expected.items():
            got = sharded[n]
            if hasattr(got, "to_local"):
                assert same(got.to_local(), rows_of(v)), (folder, n, comm.rank)
            else:
                assert same(got, v), (folder, n)
        if folder.startswith("dcp_flat"):
            assert nested["step"] == 42 and nested["meta"] == META
        # Shard(1) targets of the tensors of 2 or more dims: every chunk cut across its rows.
        cols = {n: DTensor.from_local(torch.zeros_like(cols_of(v)), mesh, [Shard(1)], run_check=False,
                                      shape=v.shape, stride=v.stride())
                for n, v in expected.items() if v.dim() >= 2}
        dcp.load(cols, checkpoint_id=os.path.join(WORK, folder))
        for n, got in cols.items():
            assert same(got.to_local(), cols_of(expected[n])), (folder, n, "Shard(1)", comm.rank)
        plain = {n: torch.zeros_like(v) for n, v in expected.items()}
        dcp.load(plain, checkpoint_id=os.path.join(WORK, folder))
        for n, v in expected.items():
            assert same(plain[n], v), (folder, n, "plain")


def flat_tensors(d, prefix=""):
    """(dotted name, leaf) of a nested state dict: dicts holding a tensor are walked, other values
    (a dict of plain values among them) are leaves."""
    def holds_tensor(v):
        return isinstance(v, torch.Tensor) or (isinstance(v, dict) and any(holds_tensor(x) for x in v.values()))
    for k, v in d.items():
        if isinstance(v, dict) and holds_tensor(v):
            yield from flat_tensors(v, prefix + str(k) + ".")
        else:
            yield prefix + str(k), v


@pytest.mark.skipif(PHASE != "load", reason="load phase only")
def test_dcp_to_torch_save(comm):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    if comm.rank != 0:
        return
    for folder, expected in dcp_load_cases():
        out = os.path.join(WORK, folder + ".pt")
        dcp_to_torch_save(os.path.join(WORK, folder), out)
        got = torch.load(out, weights_only=folder.startswith("dcp_box"))
        extra = {"step": 42, "meta": META} if folder.startswith("dcp_flat") else {}
        if folder.startswith("dcp_flat"):
            # Nested as the state shardckpt.save was given: the export's planner_data carries the
            # manifest's torch_paths, and dcp_to_torch_save rebuilds the dicts by it.
            assert all(isinstance(got[n.partition(".")[0]], dict) for n in expected if "." in n), sorted(got)
            got = dict(flat_tensors(got))
        assert sorted(got) == sorted(list(expected) + list(extra)), (folder, sorted(got))
        for n, v in expected.items():
            assert same(got[n], v), (folder, n)
        for n, v in extra.items():
            assert got[n] == v, (folder, n)


@pytest.mark.skipif(PHASE != "save", reason="save phase only")
def test_export_to_a_path_that_is_not_utf8(comm):
    """The .metadata names its folder as torch pickles a path, os.fsdecode's str: torch read
    none of an export into a folder whose name is not UTF-8 (UnicodeDecodeError)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    base = os.fsencode(os.path.join(WORK, "not_utf8_rank%d" % comm.rank))
    state = {"w": full("w", (5, 3), torch.float32), "step": 7}
    shardckpt.save(state, base + b"-\xff", 1, comm=shardckpt.single_process())
    out = base + b"-\xfe-dcp"
    report = shardckpt.export(base + b"-\xff", out)
    assert os.fsencode(report["out"]) == out, report
    assert FileSystemReader(os.fsdecode(out)).read_metadata().storage_meta.checkpoint_id == os.fsdecode(out)
    dcp_to_torch_save(os.fsdecode(out), os.fsdecode(base + b".pt"))
    got = torch.load(os.fsdecode(base + b".pt"))
    assert same(got["w"], state["w"]) and got["step"] == 7, got
    # A problem verify finds names the folder: a DataLoss, not a UnicodeDecodeError.
    distcp = [n for n in os.listdir(out) if n.endswith(b".distcp")][0]
    os.truncate(out + b"/" + distcp, 3)
    with pytest.raises(shardckpt.DataLoss) as damaged:
        shardckpt.verify(out)
    assert os.fsdecode(out) in damaged.value.message


def consolidate(*args):
    return subprocess.run([cli(), "consolidate", *args], capture_output=True, text=True)


@pytest.mark.skipif(PHASE != "load", reason="load phase only")
def test_gguf_read_back_by_gguf_package(comm):
    gguf = pytest.importorskip("gguf")
    if comm.rank != 0:
        return
    box = glob.glob(os.path.join(WORK, "box", "step-*"))[0]
    meta = os.path.join(WORK, "gguf_meta.json")
    with open(meta, "w") as f:
        json.dump({"general.name": "from-file", "llama.context_length": 2048,
                   "llama.rope.freq_base": 10000.0, "x.flag": True, "x.neg": -3}, f)
    expected = {n: full(n, s, d) for n, (s, d) in BOX.items() if n != "i"}
    for cast, types in ((None, {torch.bfloat16: 30, torch.float32: 0}),
                        ("fp16", {torch.bfloat16: 1, torch.float32: 1})):
        out = os.path.join(WORK, "model-%s.gguf" % cast)
        flags = ["--dtype", cast] if cast else []
        r = consolidate(box, "--out", out, "--exclude", "i", "--gguf-arch", "llama", "--gguf-name",
                        "tiny", "--gguf-metadata", meta, *flags)
        assert r.returncode == 0, r.stderr
        reader = gguf.GGUFReader(out)
        fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        assert fields == {"general.architecture": "llama", "general.name": "tiny",
                          "llama.context_length": 2048, "llama.rope.freq_base": 10000.0,
                          "x.flag": True, "x.neg": -3, "general.alignment": 32}, fields
        assert reader.fields["GGUF.version"].contents() == 3
        assert sorted(t.name for t in reader.tensors) == sorted(expected)
        for t in reader.tensors:
            want = expected[t.name]
            if cast:
                want = want.to(torch.float16)
            shape = list(want.shape)[::-1] or [1]  # GGUF lists dims innermost first; 0-d as [1]
            assert [int(d) for d in t.shape] == shape, t.name
            assert int(t.tensor_type) == types[expected[t.name].dtype], t.name
            assert t.data_offset % 32 == 0
            assert t.data.tobytes() == want.reshape(-1).view(torch.uint8).numpy().tobytes(), t.name
    # Flat shards, selected and renamed as for the other outputs.
    flat = glob.glob(os.path.join(WORK, "flat", "step-*"))[0]
    out = os.path.join(WORK, "flat.gguf")
    r = consolidate(flat, "--out", out, "--include", "params.[wbe]", "--strip-prefix", "params.",
                    "--gguf-arch", "llama")
    assert r.returncode == 0, r.stderr
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert "general.name" not in reader.fields
    got = {t.name: t for t in reader.tensors}
    assert sorted(got) == ["b", "e", "w"]
    for name in got:
        shape, dtype = FLAT["params." + name]
        want = full("params." + name, shape, dtype)
        assert [int(d) for d in got[name].shape] == list(shape)[::-1], name
        assert got[name].data.tobytes() == want.reshape(-1).view(torch.uint8).numpy().tobytes(), name
    # From Python: the same writer.
    out = os.path.join(WORK, "py.gguf")
    report = shardckpt.consolidate_gguf(box, out, "llama", name="t", metadata={"x.k": 1, "x.on": False},
                                        exclude=["i"], dtype="float16")
    assert report["entries"] == 3 and report["files"] == [out], report
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.name"].contents() == "t" and reader.fields["x.k"].contents() == 1
    assert reader.fields["x.on"].contents() is False
    assert {int(t.tensor_type) for t in reader.tensors} == {1}
    with pytest.raises(shardckpt.InvalidArgument, match="tensor 'i' is int64"):
        shardckpt.consolidate_gguf(box, out, "llama")
    # consolidate() picks GGUF from the extension, as the command line does.
    out2 = os.path.join(WORK, "py2.gguf")
    report = shardckpt.consolidate(box, out2, exclude=["i"], dtype="fp16",
                                   gguf_architecture="llama", gguf_name="t")
    assert report["files"] == [out2], report
    assert gguf.GGUFReader(out2).fields["general.name"].contents() == "t"
    # int64 has no place in GGUF output: refused by name, and no file is left.
    out = os.path.join(WORK, "refused.gguf")
    r = consolidate(box, "--out", out, "--gguf-arch", "llama")
    assert r.returncode == 1 and "tensor 'i' is int64" in r.stderr and "GGUF" in r.stderr, r.stderr
    assert not os.path.exists(out) and not os.path.exists(out + ".partial")
    r = consolidate(box, "--out", out, "--exclude", "i")
    assert r.returncode == 1 and "general.architecture" in r.stderr, r.stderr
    bad = os.path.join(WORK, "bad_meta.json")
    with open(bad, "w") as f:
        json.dump({"llama.layers": [1, 2]}, f)
    r = consolidate(box, "--out", out, "--exclude", "i", "--gguf-arch", "llama", "--gguf-metadata", bad)
    assert r.returncode == 1 and "'llama.layers'" in r.stderr, r.stderr
