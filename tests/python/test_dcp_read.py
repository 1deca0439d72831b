"""shardckpt reading PyTorch DCP folders written by torch 2.x's dcp.save (dcp_read_gen.sh wrote
them into test-work/dcp_read_data): consolidate, import, verify, inspect and a resharded load
at 3 ranks, each compared with the full state torch saved; hostile .metadata files refused by
name with nothing executed; a truncated .distcp found by verify.

The load test runs under mpirun -np 3 (-k load); the rest in one process (-k 'not load')."""
import copy
import json
import os
import pickle
import shutil
import subprocess

import pytest
import torch

import shardckpt

WORK = os.environ.get("SHARDCKPT_PY_WORK", "/tmp/shardckpt-pytest")
DATA = os.path.join(os.path.dirname(os.path.abspath(WORK)), "dcp_read_data")
CLI = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(shardckpt.__file__)))), "bin", "shardckpt")


def full_tensors(name):
    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, prefix + k + ".")
            else:
                yield prefix + k, v
    full = torch.load(os.path.join(DATA, name + ".full.pt"), weights_only=True)
    return {k: v for k, v in flat(full) if isinstance(v, torch.Tensor)}


def cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True)


# The byte items of each folder: consolidate writes them into the .pt with their types.
VALUES = {"single": {"step": 17, "name": "run-a", "lr": 0.25}, "dist": {"epoch": 3, "tags": ["a", "b"]}}


def assert_values(name, got):
    for k, v in VALUES[name].items():
        assert k in got and got[k] == v and type(got[k]) is type(v), (k, got.get(k))


def flattened(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flattened(v, prefix + str(k) + "."))
        else:
            out[prefix + str(k)] = v
    return out


def assert_equal_state(expected, got):
    got = {k: v for k, v in flattened(got).items() if isinstance(v, torch.Tensor)}
    assert sorted(expected) == sorted(got)
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v), k


def assert_same_tree(expected, got, where="the state dict"):
    """The same nesting (dicts and lists, keys in the same order), tensors and values equal."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), (where, list(got), list(expected))
        for k in expected:
            assert_same_tree(expected[k], got[k], "%s[%r]" % (where, k))
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (where, got)
        for i, (a, b) in enumerate(zip(expected, got)):
            assert_same_tree(a, b, "%s[%d]" % (where, i))
    elif isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype and torch.equal(got, expected), where
    else:
        assert got == expected and type(got) is type(expected), (where, got, expected)


def dcp_to_torch_save_of(folder, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = str(tmp_path / "dcp_to_torch_save.pt")
    dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("name", ["single", "dist"])
def test_consolidate_equals_the_full_state(name, tmp_path):
    out = tmp_path / (name + ".pt")
    result = shardckpt.consolidate(os.path.join(DATA, name), str(out))
    assert result["entries"] == len(full_tensors(name))
    loaded = torch.load(out, weights_only=True)
    assert_equal_state(full_tensors(name), loaded)
    assert_values(name, loaded)
    # The nesting dcp.save flattened comes back as dcp_to_torch_save gives it: the same dicts,
    # keys in the same order (.metadata's, byte items in their place among the tensors).
    assert_same_tree(dcp_to_torch_save_of(os.path.join(DATA, name), tmp_path), loaded)
    run = cli("consolidate", os.path.join(DATA, name), "--out", str(tmp_path / "cli.pt"), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert sorted(report["values"]) == sorted(VALUES[name]) and report["skipped"] == []


def test_nesting_and_lists_dcp_flattened_come_back_through_consolidate_import_and_export(tmp_path):
    # A training job's DCP checkpoint: model and optimizer under their own keys, param_groups a
    # list of dicts, a list of tensors. consolidate gives what dcp_to_torch_save gives, also after
    # import and reshard (the paths ride in the manifest), and export writes them back into
    # planner_data, so dcp_to_torch_save of the export nests as the original did.
    import torch.distributed.checkpoint as dcp
    sd = {"epoch": 3,  # values before, between and after tensors keep their places
          "model": {"layers.0.weight": torch.arange(4.0).reshape(2, 2), "bias": torch.zeros(2),
                    "sub": {"x": torch.ones(3), "deeper": {"y": torch.zeros(1)}}},
          "optim": {"state": {0: {"exp_avg": torch.full((2,), 3.0), "step": torch.tensor(5.0)}},
                    "param_groups": [{"lr": 0.1, "params": [0]}, {"lr": 0.2, "params": [1, 2]}]},
          "scheduler": {"last_epoch": 3, "base_lrs": [0.1, 0.2]},
          "extra": [torch.ones(1), torch.zeros(3)], "name": "run-b"}
    folder = str(tmp_path / "f")
    dcp.save(sd, checkpoint_id=folder, no_dist=True)
    expected = dcp_to_torch_save_of(folder, tmp_path)
    assert isinstance(expected["optim"]["param_groups"], list)
    assert list(expected) == ["epoch", "model", "optim", "scheduler", "extra", "name"]

    shardckpt.consolidate(folder, str(tmp_path / "direct.pt"))
    assert_same_tree(expected, torch.load(tmp_path / "direct.pt", weights_only=True))
    root = str(tmp_path / "root")
    shardckpt.import_checkpoint(folder, root, 2, "dim0")
    shardckpt.reshard(root, str(tmp_path / "root3"), 3, "dim0")
    shardckpt.consolidate(str(tmp_path / "root3"), str(tmp_path / "resharded.pt"))
    assert_same_tree(expected, torch.load(tmp_path / "resharded.pt", weights_only=True))
    # --strip-prefix drops the levels the prefix spans: the model's own state dict at the top.
    run = cli("consolidate", folder, "--out", str(tmp_path / "model.pt"), "--include", "model.*", "--strip-prefix", "model.")
    assert run.returncode == 0, run.stderr
    assert_same_tree(expected["model"], torch.load(tmp_path / "model.pt", weights_only=True))
    run = cli("consolidate", folder, "--out", str(tmp_path / "sub.pt"), "--include", "model.sub.*", "--strip-prefix", "model.sub.")
    assert run.returncode == 0, run.stderr
    assert_same_tree(expected["model"]["sub"], torch.load(tmp_path / "sub.pt", weights_only=True))
    # a prefix that ends inside a key ("layers.0.weight" is one) leaves the rest of it as a key
    run = cli("consolidate", folder, "--out", str(tmp_path / "cut.pt"), "--include", "model.layers.*", "--strip-prefix", "model.layers.")
    assert run.returncode == 0, run.stderr
    assert_same_tree({"0.weight": expected["model"]["layers.0.weight"]}, torch.load(tmp_path / "cut.pt", weights_only=True))
    # values alone (a scheduler's, the param groups) are a state dict too
    run = cli("consolidate", folder, "--out", str(tmp_path / "groups.pt"), "--include", "optim.param_groups.*")
    assert run.returncode == 0, run.stderr
    assert_same_tree({"optim": {"param_groups": expected["optim"]["param_groups"]}},
                     torch.load(tmp_path / "groups.pt", weights_only=True))
    run = cli("consolidate", folder, "--out", str(tmp_path / "none.pt"), "--include", "nothing.*")
    assert run.returncode == 1 and "no entry of" in run.stderr, run.stderr

    # inspect shows the start of the recorded paths; --json has them whole
    run = cli("inspect", root)
    line = next(l for l in run.stdout.splitlines() if l.startswith("meta        torch_paths = "))
    assert line.endswith(" bytes)") and len(line) < 300, line
    paths = json.loads(json.loads(cli("inspect", root, "--json").stdout)["created"]["user"]["torch_paths"])
    assert paths["optim.param_groups.0.lr"] == ["optim", "param_groups", 0, "lr"]
    run = cli("export", root, "--format", "dcp", "--out", str(tmp_path / "exported"))
    assert run.returncode == 0, run.stderr
    (tmp_path / "again").mkdir()
    assert_same_tree(expected, dcp_to_torch_save_of(str(tmp_path / "exported"), tmp_path / "again"))


def test_planner_data_that_lies_or_names_other_keys_is_not_followed(tmp_path):
    # Paths only shape the output: one whose steps do not join to its key, or for a key the
    # folder does not hold, is passed over (that key stays at the top), never an error or a loss.
    import torch.distributed.checkpoint as dcp
    folder = str(tmp_path / "f")
    dcp.save({"model": {"w": torch.ones(2), "b": torch.zeros(2)}}, checkpoint_id=folder, no_dist=True)
    md = pickle.load(open(os.path.join(folder, ".metadata"), "rb"))
    md.planner_data = {"model.w": ("model", "w"), "model.b": ("model", "c"), "ghost.x": ("ghost", "x"),
                       "model": ("model", -1)}
    pickle.dump(md, open(os.path.join(folder, ".metadata"), "wb"))
    shardckpt.consolidate(folder, str(tmp_path / "o.pt"))
    got = torch.load(tmp_path / "o.pt", weights_only=True)
    assert list(got) == ["model", "model.b"] and list(got["model"]) == ["w"], got
    assert torch.equal(got["model"]["w"], torch.ones(2)) and torch.equal(got["model.b"], torch.zeros(2))


def test_import_gains_checksums_and_verifies(tmp_path):
    report = shardckpt.import_checkpoint(os.path.join(DATA, "dist"), str(tmp_path / "root"), 3, "dim0")
    assert report["tensors"] == len(full_tensors("dist"))
    verified = shardckpt.verify(report["path"])
    assert verified.bytes_checked > 0 and verified.problems == []
    shardckpt.consolidate(report["path"], str(tmp_path / "back.pt"))
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert_equal_state(full_tensors("dist"), back)
    # The byte items came along as value blobs: typed, as the Python package stores values.
    blobs = {b["name"] for b in shardckpt.inspect(report["path"])["blobs"]}
    assert blobs == {"epoch", "tags"}
    assert_values("dist", back)


def test_import_and_reshard_refuse_a_root_inside_the_dcp_folder_they_read(tmp_path):
    # Consolidate and export refused an output inside the folder they read; import and reshard
    # wrote their root into it (a shardckpt step folder was refused by the commit, a DCP folder,
    # which has no step folders, not at all).
    folder = str(tmp_path / "dcp")
    shutil.copytree(os.path.join(DATA, "dist"), folder)
    before = sorted(os.listdir(folder))
    for verb, out in (("import", "ck"), ("reshard", "rs")):
        run = cli(verb, folder, "--out", os.path.join(folder, out), "--world-size", "2")
        assert run.returncode != 0, (verb, run.stdout)
        assert "lies inside the checkpoint %s being read" % folder in run.stderr, (verb, run.stderr)
    assert sorted(os.listdir(folder)) == before


def test_inspect_lists_tensors_and_byte_items():
    run = cli("inspect", os.path.join(DATA, "dist"), "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["format"] == "dcp" and out["world_size"] == 2
    entries = {e["name"]: e for e in out["entries"]}
    assert entries["rows"]["shape"] == [7, 5] and entries["rows"]["chunks"] == 2
    assert entries["bf"]["dtype"] == "bfloat16" and entries["tok"]["dtype"] == "int64"
    # Shard(0)/Shard(1) pieces are boxes; a plain tensor every rank saved is one whole chunk.
    assert entries["rows"]["layouts"] == "box" and entries["cols"]["layouts"] == "box"
    assert entries["plain"]["layouts"] == "whole" and entries["plain"]["chunks"] == 1
    assert {b["name"]: b["plain"] for b in out["blobs"]} == {"epoch": True, "tags": True}


def test_verify_checks_structure_and_says_bytes_are_unverified():
    run = cli("verify", os.path.join(DATA, "dist"), "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["ok"] and out["checksums"] is False and out["files"] == 2
    assert "cannot be verified" in out["note"] and "shardckpt import" in out["note"]
    report = shardckpt.verify(os.path.join(DATA, "dist"))
    assert report.checksums is False and "cannot be verified" in report.note
    text = cli("verify", os.path.join(DATA, "dist")).stdout  # says what it checked, not "0 blocks"
    assert "structure only (no checksums stored)" in text and "blocks checked" not in text, text


def copy_folder(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(os.path.join(DATA, name), dst)
    return dst


def test_verify_checks_sha256_files_where_every_file_has_one(tmp_path):
    import hashlib
    folder = copy_folder("dist", tmp_path)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".distcp"))
    for n in names:  # sha256sum's form, as shardckpt export writes it
        digest = hashlib.sha256((folder / n).read_bytes()).hexdigest()
        (folder / (n + ".sha256")).write_text("%s  %s\n" % (digest, n))
    out = json.loads(cli("verify", str(folder), "--json").stdout)
    assert out["ok"] and out["checksums"] is True and out["bytes_checked"] == sum((folder / n).stat().st_size for n in names)
    assert ".sha256" in out["note"]
    assert "whole files checked against their checksums" in cli("verify", str(folder)).stdout
    # A flipped byte inside a chunk's data: structure alone cannot see it, the .sha256 does.
    victim = folder / names[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    run = cli("verify", str(folder), "--json")
    assert run.returncode == 1
    problems = json.loads(run.stdout)["problems"]
    assert [p["file"] for p in problems] == [names[1]] and "does not match" in problems[0]["problem"]
    # A whole file's problem names what the file holds (it read as "padding"), in the text too.
    assert problems[0]["entries"] or problems[0]["blobs"], problems[0]
    text = cli("verify", str(folder)).stdout + cli("verify", str(folder)).stderr
    assert "(padding)" not in text and ("'%s'" % (problems[0]["entries"] or problems[0]["blobs"])[0]) in text, text
    os.remove(folder / (names[0] + ".sha256"))  # some files without one: structure only, said so
    (folder / (names[1] + ".sha256")).unlink()
    out = json.loads(cli("verify", str(folder), "--json").stdout)
    assert out["checksums"] is False and "cannot be verified" in out["note"]


def test_truncated_distcp_is_found_by_verify(tmp_path):
    folder = copy_folder("dist", tmp_path)
    victim = folder / "__1_0.distcp"
    os.truncate(victim, victim.stat().st_size - 3000)
    run = cli("verify", str(folder), "--json")
    assert run.returncode == 1
    problems = json.loads(run.stdout)["problems"]
    assert problems and all(p["file"] == "__1_0.distcp" for p in problems)
    assert any("opt.meta.betas" in p["entries"] for p in problems)
    assert any("past the end" in p["problem"] or "truncated" in p["problem"] for p in problems)
    # A load or consolidation refuses it too, naming the file.
    with pytest.raises(shardckpt.DataLoss, match="__1_0.distcp"):
        shardckpt.consolidate(str(folder), str(tmp_path / "x.pt"))
    # Cut into its first byte item: that is listed as a blob, not as a tensor.
    os.truncate(victim, 1000)
    problems = json.loads(cli("verify", str(folder), "--json").stdout)["problems"]
    epoch = [p for p in problems if "epoch" in p["blobs"]]
    assert epoch and epoch[0]["entries"] == [] and "past the end" in epoch[0]["problem"]
    assert not any("epoch" in p["entries"] for p in problems)
    # Gone: one problem for the file, naming its tensors and byte items (it said "padding").
    os.unlink(victim)
    run = cli("verify", str(folder), "--json")
    assert run.returncode == 1
    problems = json.loads(run.stdout)["problems"]
    assert [p["file"] for p in problems] == ["__1_0.distcp"], problems
    assert problems[0]["problem"].startswith("missing: ") and not problems[0]["unreadable"], problems
    assert json.loads(run.stdout)["damaged"] is True
    assert "opt.meta.betas" in problems[0]["entries"] and "epoch" in problems[0]["blobs"], problems
    assert "(padding)" not in cli("verify", str(folder)).stdout


class RunsAShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def write_metadata(folder, edit):
    metadata = pickle.load(open(os.path.join(DATA, "single", ".metadata"), "rb"))
    edit(metadata)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def storage_of(metadata, fqn):
    return next(k for k in metadata.storage_data if k.fqn == fqn)


def test_hostile_metadata_executing_code_is_refused_by_name(tmp_path):
    folder = copy_folder("single", tmp_path)
    marker = str(tmp_path / "ran")
    write_metadata(folder, lambda m: setattr(m, "planner_data", RunsAShell(marker)))
    for verb in (["inspect"], ["verify"], ["consolidate", "--out", str(tmp_path / "o.pt")]):
        run = cli(verb[0], str(folder), *verb[1:])
        assert run.returncode == 1
        assert "global 'posix.system' is not allowed" in run.stderr, run.stderr
    assert not os.path.exists(marker)


def test_byte_items_that_are_not_plain_are_reported_never_run(tmp_path):
    import torch.distributed.checkpoint as dcp
    marker = str(tmp_path / "ran")
    folder = str(tmp_path / "f")
    dcp.save({"w": torch.ones(2), "n": 5, "dt": torch.float16, "evil": RunsAShell(marker),
              "size": torch.Size([2, 3]), "grp": {"lr": 0.1, "dt": torch.bfloat16}}, checkpoint_id=folder, no_dist=True)
    run = cli("inspect", folder, "--json")
    assert run.returncode == 0, run.stderr
    blobs = {b["name"]: b for b in json.loads(run.stdout)["blobs"]}
    assert blobs["n"]["plain"] and not blobs["dt"]["plain"] and not blobs["evil"]["plain"]
    assert "posix.system" in blobs["evil"]["not_plain_because"]
    ours = {b["name"]: b for b in shardckpt.inspect(folder)["blobs"]}  # the same from Python
    assert ours["n"]["plain"] and not ours["evil"]["plain"] and "posix.system" in ours["evil"]["not_plain_because"]
    report = shardckpt.import_checkpoint(folder, str(tmp_path / "root"), 2)
    # A torch.Size would come back a tuple: not plain, skipped with the rest.
    assert sorted(s.split(" ")[0] for s in report["skipped"]) == ["dt", "evil", "grp.dt", "size"], report["skipped"]
    assert {b["name"] for b in shardckpt.inspect(report["path"])["blobs"]} == {"n", "grp.lr"}
    # Consolidated straight from the folder: each such item named with inspect's reason.
    out = shardckpt.consolidate(folder, str(tmp_path / "m.pt"))
    skipped = {s.split(" ")[0]: s for s in out["skipped"]}
    assert sorted(skipped) == ["dt", "evil", "grp.dt", "size"], out["skipped"]
    assert "a DCP byte item that is not plain values" in skipped["dt"] and "posix.system" in skipped["evil"], skipped
    # Loaded in place: a dtype is what torch's weights_only unpickler restores; the object is
    # reported unavailable with both refusals, and the target keeps its value.
    # A value DCP stored leaf by leaf takes the same path for each leaf.
    target = {"w": torch.zeros(2), "n": 0, "dt": None, "evil": "kept", "size": None, "grp": {"lr": 0.0, "dt": None}}
    report = shardckpt.load(target, folder)
    assert target["n"] == 5 and target["dt"] == torch.float16 and target["evil"] == "kept", target
    assert type(target["size"]) is torch.Size and target["size"] == torch.Size([2, 3]), target
    assert target["grp"] == {"lr": 0.1, "dt": torch.bfloat16}, target
    assert list(report.unavailable) == ["evil"], report.unavailable
    assert "global 'posix.system' is not allowed" in report.unavailable["evil"], report.unavailable
    assert "weights_only=True) refuses it too" in report.unavailable["evil"], report.unavailable
    assert "posix.system" in report.unavailable["evil"].split("refuses it too")[1], report.unavailable
    assert not os.path.exists(marker)


def test_export_of_a_dcp_folder_copies_items_of_more_than_plain_values(tmp_path):
    # A torch.Size, a dtype, a tuple holding a tensor: DCP byte items shardckpt does not unpickle.
    # Exported again they were wrapped as bytes values, and dcp.load gave the zip's bytes back.
    import torch.distributed.checkpoint as dcp
    state = {"w": torch.ones(2), "size": torch.Size([2, 3]), "dt": torch.float16, "tup": (torch.ones(2), 3), "epoch": 3}
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    dcp.save(state, checkpoint_id=src, no_dist=True)
    report = shardckpt.export(src, out)
    assert report["byte_items"] == 4 and report["skipped"] == [], report
    back = {"w": torch.zeros(2), "size": None, "dt": None, "tup": None, "epoch": None}
    dcp.load(back, checkpoint_id=out, no_dist=True)
    assert type(back["size"]) is torch.Size and back["size"] == torch.Size([2, 3]), back
    assert back["dt"] is torch.float16 and back["epoch"] == 3, back
    assert torch.equal(back["tup"][0], torch.ones(2)) and back["tup"][1] == 3, back
    shardckpt.verify(out)  # the .sha256 files cover the copied items too


def test_bytes_values_survive_export_and_a_read_in_place(tmp_path):
    # Bytes are written as torch.save writes them (_codecs.encode), which torch 2.x's weights_only
    # reader takes; read back in place they are the bytes, not the item's zip. A value that
    # begins with one of the package's own tags stays bytes too.
    import torch.distributed.checkpoint as dcp
    # Past a tensor chunk's 1 MiB pickle, and mostly bytes past 0x7f (two bytes each in the pickle).
    big = bytes((i * 131 + 7) % 256 for i in range(1_500_000))
    state = {"w": torch.arange(3.0), "raw": b'{"a":1}', "tagged": b"\x00J{\xff", "blob": bytearray(b"xyz"),
             "cfg": {"k": b"\x80\x00", "t": (1, "a")}, "big": big}
    saved = shardckpt.save(state, str(tmp_path / "root"), step=3, comm=shardckpt.single_process())
    folder = str(tmp_path / "dcp")
    shardckpt.export(saved.path, folder)
    plain = {b["name"]: b["plain"] for b in shardckpt.inspect(folder)["blobs"]}
    assert plain == {"raw": True, "tagged": True, "blob": True, "cfg": True, "big": True}, plain
    target = {"w": torch.zeros(3), "raw": b"", "tagged": b"", "blob": bytearray(), "cfg": None, "big": b""}
    report = shardckpt.load(target, folder, comm=shardckpt.single_process())
    assert report.unavailable == {}, report.unavailable
    assert target["raw"] == b'{"a":1}' and target["tagged"] == b"\x00J{\xff" and target["blob"] == b"xyz", target
    assert target["cfg"] == {"k": b"\x80\x00", "t": (1, "a")}, target["cfg"]
    assert target["big"] == big and type(target["blob"]) is bytes  # a bytearray is exported as bytes
    theirs = {"w": torch.zeros(3), "raw": b"", "tagged": b"", "blob": b"", "cfg": None}
    dcp.load(theirs, checkpoint_id=folder, no_dist=True)
    assert theirs["raw"] == b'{"a":1}' and theirs["tagged"] == b"\x00J{\xff" and theirs["cfg"]["k"] == b"\x80\x00"
    # Each byte item is a torch.save zip that torch's weights_only reader restores.
    import io
    storage = dcp.FileSystemReader(folder).read_metadata().storage_data
    restored = {}
    for index, info in storage.items():
        if index.fqn in ("raw", "blob", "cfg"):
            with open(os.path.join(folder, info.relative_path), "rb") as f:
                f.seek(info.offset)
                restored[index.fqn] = torch.load(io.BytesIO(f.read(info.length)), weights_only=True)
    assert restored == {"raw": b'{"a":1}', "blob": b"xyz", "cfg": {"k": b"\x80\x00", "t": (1, "a")}}, restored
    # Imported, the folder's bytes items load and consolidate as the same bytes (a C++ load gets
    # the bytes too: torch_formats_test ABlobSurvivesExportToDcpAndImport).
    imported = shardckpt.import_checkpoint(folder, str(tmp_path / "imported"), 1)["path"]
    again = {"w": torch.zeros(3), "raw": b"", "tagged": b"", "blob": b"", "cfg": None, "big": b""}
    report = shardckpt.load(again, imported, comm=shardckpt.single_process())
    assert report.unavailable == {} and again["tagged"] == b"\x00J{\xff" and again["raw"] == b'{"a":1}', again
    assert again["big"] == big and again["cfg"] == {"k": b"\x80\x00", "t": (1, "a")}
    result = shardckpt.consolidate(imported, str(tmp_path / "imported.pt"))
    assert result["skipped"] == [], result["skipped"]
    back = torch.load(str(tmp_path / "imported.pt"), weights_only=True)
    assert back["tagged"] == b"\x00J{\xff" and back["blob"] == b"xyz" and back["big"] == big


def test_optimizer_param_groups_that_dcp_flattened_come_back_as_one_value(tmp_path):
    # DCP writes an optimizer's param_groups leaf by leaf (optim.param_groups.0.lr, ...); the
    # same state dict handed to shardckpt holds them as one value (a list with no tensor), which
    # must be regrouped, not reported missing (NotFound under strict) with its leaves unexpected.
    import torch.distributed.checkpoint as dcp
    groups = [{"lr": 0.25, "betas": (0.9, 0.95), "params": ["l1.weight", "l1.bias"], "foreach": None},
              {"lr": 0.5, "betas": (0.8, 0.9), "params": ["l2.weight"], "foreach": True}]
    folder = str(tmp_path / "f")
    dcp.save({"optim": {"state": {"l1.weight": {"exp_avg": torch.arange(4.0)}}, "param_groups": groups},
              "step": 7}, checkpoint_id=folder, no_dist=True)
    target = {"optim": {"state": {"l1.weight": {"exp_avg": torch.zeros(4)}},
                        "param_groups": [{"lr": 0.0, "betas": (0.0, 0.0), "params": ["l1.weight", "l1.bias"],
                                          "foreach": False},
                                         {"lr": 0.0, "betas": (0.0, 0.0), "params": ["l2.weight"],
                                          "foreach": False}]},
              "step": 0}
    report = shardckpt.load(target, folder)
    assert report.missing == [] and report.unexpected == []
    assert target["optim"]["param_groups"] == groups and target["step"] == 7
    assert torch.equal(target["optim"]["state"]["l1.weight"]["exp_avg"], torch.arange(4.0))
    # a leaf the folder lacks makes the whole value missing, named as the target names it
    other = {"optim": {"param_groups": [{"lr": 0.0, "extra": 1}]}}
    report = shardckpt.load(other, folder, strict=False)
    assert report.missing == ["optim"] and "optim.param_groups.0.lr" in report.unexpected
    assert other["optim"]["param_groups"] == [{"lr": 0.0, "extra": 1}]
    # Strict: refused before anything is read, naming the leaf the folder lacks.
    target["optim"]["state"]["l1.weight"]["exp_avg"] = torch.zeros(4)
    target["optim"]["param_groups"][1]["extra"] = 1
    with pytest.raises(shardckpt.NotFound) as error:
        shardckpt.load(target, folder)
    assert "'optim.param_groups.1.extra'" in error.value.message, error.value.message
    assert torch.equal(target["optim"]["state"]["l1.weight"]["exp_avg"], torch.zeros(4))
    # Regrouped leaf by leaf, groups of other members are refused as from a shardckpt checkpoint.
    del target["optim"]["param_groups"][1]["extra"]
    target["optim"]["param_groups"][0]["params"] = ["l1.weight"]
    target["optim"]["param_groups"][1]["params"] = ["l1.bias", "l2.weight"]
    with pytest.raises(shardckpt.InvalidArgument) as error:
        shardckpt.load(target, folder)
    assert ("'optim.param_groups': the checkpoint's optimizer has 2 parameter groups (of 2 + 1 parameters), "
            "this one 2 parameter groups (of 1 + 2 parameters)") in error.value.message, error.value.message


def test_containers_dcp_flattened_keep_the_class_of_the_value_loaded_into(tmp_path):
    # dcp.save walks an OrderedDict leaf by leaf, as a dict; dcp.load fills the one it is given.
    # shardckpt rebuilt a plain dict (and list) from the leaves; it keeps the target's class.
    import collections
    import torch.distributed.checkpoint as dcp
    folder = str(tmp_path / "f")
    dcp.save({"odict": collections.OrderedDict(a=1, b={"c": 2.5}),
              "groups": [collections.OrderedDict(lr=0.5, n=3)]}, checkpoint_id=folder, no_dist=True)
    target = {"odict": collections.OrderedDict(a=0, b={"c": 0.0}), "groups": [collections.OrderedDict(lr=0.0, n=0)]}
    report = shardckpt.load(target, folder)
    assert report.missing == [] and report.unexpected == []
    assert type(target["odict"]) is collections.OrderedDict, type(target["odict"])
    assert target["odict"] == collections.OrderedDict(a=1, b={"c": 2.5}) and type(target["odict"]["b"]) is dict
    assert type(target["groups"]) is list and type(target["groups"][0]) is collections.OrderedDict
    assert target["groups"] == [collections.OrderedDict(lr=0.5, n=3)]


def test_empty_dicts_dcp_stores_nothing_of_match_as_dcp_load_takes_them(tmp_path):
    # DCP flattens an empty dict (a disabled GradScaler's state_dict(), empty hooks) to no item:
    # dcp.load takes the same state dict back, so must shardckpt (it refused: NotFound 'extra',
    # 'scaler'); a value that is there still loads, and in our own checkpoints an empty dict is
    # a value that must be there.
    import torch.distributed.checkpoint as dcp
    folder = str(tmp_path / "f")
    dcp.save({"w": torch.arange(4.0), "extra": {"epoch": 3, "hooks": {}}, "scaler": {}, "nest": {"a": {}},
              "lst": [{}], "kept": [[]]}, checkpoint_id=folder, no_dist=True)
    target = {"w": torch.zeros(4), "extra": {"epoch": 0, "hooks": {}}, "scaler": {}, "nest": {"a": {}},
              "lst": [{}], "kept": [[1]]}
    reference = copy.deepcopy(target)
    dcp.load(reference, checkpoint_id=folder, no_dist=True)
    report = shardckpt.load(target, folder)
    assert report.missing == [] and report.unexpected == []
    assert target["extra"] == {"epoch": 3, "hooks": {}} == reference["extra"]
    assert target["scaler"] == {} and target["nest"] == {"a": {}} and target["lst"] == [{}]
    assert target["kept"] == [[]] == reference["kept"]  # a list of lists is one item DCP stores
    assert torch.equal(target["w"], torch.arange(4.0))
    ours = str(tmp_path / "ours")
    shardckpt.save({"w": torch.arange(4.0)}, ours, 1, comm=shardckpt.single_process())
    with pytest.raises(shardckpt.NotFound) as error:
        shardckpt.load({"w": torch.zeros(4), "scaler": {}}, ours, comm=shardckpt.single_process())
    assert "'scaler'" in error.value.message, error.value.message


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_pickle_protocol_reads(protocol, tmp_path):
    folder = copy_folder("single", tmp_path)
    metadata = pickle.load(open(os.path.join(DATA, "single", ".metadata"), "rb"))
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f, protocol=protocol)
    shardckpt.consolidate(str(folder), str(tmp_path / "o.pt"))
    assert_equal_state(full_tensors("single"), torch.load(tmp_path / "o.pt", weights_only=True))


def test_memory_format_pickled_by_value_reads(tmp_path):
    # Python pickles an Enum member as EnumClass(value), except early 3.11 releases such as
    # Debian 12's 3.11.2 (this venv's), which write getattr(EnumClass, NAME): folders from pip's
    # and conda's Pythons look like this one.
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING
    folder = copy_folder("single", tmp_path)
    metadata = pickle.load(open(os.path.join(DATA, "single", ".metadata"), "rb"))
    metadata.state_dict_metadata["w"].properties.memory_format = torch.channels_last
    by_value = lambda member, protocol: (type(member), (member.value,))
    saved = _MEM_FORMAT_ENCODING.__reduce_ex__
    _MEM_FORMAT_ENCODING.__reduce_ex__ = by_value
    try:
        data = pickle.dumps(metadata, protocol=4)
    finally:
        _MEM_FORMAT_ENCODING.__reduce_ex__ = saved
    assert b"getattr" not in data and b"_MEM_FORMAT_ENCODING" in data
    (folder / ".metadata").write_bytes(data)
    shardckpt.consolidate(str(folder), str(tmp_path / "o.pt"))
    assert_equal_state(full_tensors("single"), torch.load(tmp_path / "o.pt", weights_only=True))


def test_paths_pickled_by_python_3_13_read(tmp_path):
    # Python 3.13 pickles pathlib's classes from pathlib._local: storage_meta's checkpoint_id,
    # a PosixPath, as dcp.save wrote it there. Protocol 2 names globals as text lines.
    folder = copy_folder("single", tmp_path)
    metadata = pickle.load(open(os.path.join(DATA, "single", ".metadata"), "rb"))
    assert metadata.storage_meta is not None
    metadata.storage_meta.checkpoint_id = __import__("pathlib").PosixPath("/somewhere/ckpt")
    data = pickle.dumps(metadata, protocol=2)
    assert data.count(b"cpathlib\nPosixPath\n") == 1
    (folder / ".metadata").write_bytes(data.replace(b"cpathlib\nPosixPath\n", b"cpathlib._local\nPosixPath\n"))
    shardckpt.consolidate(str(folder), str(tmp_path / "o.pt"))
    assert_equal_state(full_tensors("single"), torch.load(tmp_path / "o.pt", weights_only=True))


@pytest.mark.parametrize("protocol", [0, 1])
def test_old_pickle_protocols_are_refused_by_protocol(protocol, tmp_path):
    folder = copy_folder("single", tmp_path)
    metadata = pickle.load(open(os.path.join(DATA, "single", ".metadata"), "rb"))
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f, protocol=protocol)
    run = cli("inspect", str(folder))
    assert run.returncode == 1 and "a pickle of protocol 0 or 1 (no PROTO opcode) is not supported" in run.stderr, run.stderr
    assert "global" not in run.stderr, run.stderr


def huge_count(m):
    md = m.state_dict_metadata["w"]
    md.size = torch.Size([2 ** 60, 7])
    md.chunks[0].sizes = torch.Size([2 ** 60, 7])


def huge_length(m):
    m.storage_data[storage_of(m, "w")].length = 2 ** 60


def past_the_end(m):
    info = m.storage_data[storage_of(m, "w")]
    info.offset = os.path.getsize(os.path.join(DATA, "single", info.relative_path)) + 10


def path_with(path):
    def edit(m):
        m.storage_data[storage_of(m, "w")].relative_path = path
    return edit


@pytest.mark.parametrize("edit,message", [
    (huge_count, "'w'"),
    (huge_length, "past the end"),
    (past_the_end, "past the end"),
    (path_with("../__0_0.distcp"), "not a plain file name"),
    (path_with("/etc/passwd"), "not a plain file name"),
    (path_with("sub/__0_0.distcp"), "not a plain file name"),
])
def test_hostile_metadata_values_are_refused(edit, message, tmp_path):
    folder = copy_folder("single", tmp_path)
    write_metadata(folder, edit)
    run = cli("consolidate", str(folder), "--out", str(tmp_path / "o.pt"))
    assert run.returncode == 1 and message in run.stderr, run.stderr
    assert not (tmp_path / "o.pt").exists()
    verify = cli("verify", str(folder))
    assert verify.returncode == 1


def test_the_safetensors_variant_is_refused_by_name(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    folder = str(tmp_path / "st")
    writer = dcp.FileSystemWriter(folder, serialization_format=SerializationFormat.SAFETENSORS)
    # A byte item first: the chunk's safetensors blob then starts after its torch.save zip.
    dcp.save({"w": torch.ones(3, 4), "epoch": 3}, storage_writer=writer, no_dist=True)
    run = cli("consolidate", folder, "--out", str(tmp_path / "o.pt"))
    assert run.returncode == 1 and "serialization_format=SAFETENSORS" in run.stderr, run.stderr
    # A valid folder of another layout: named for what it is, never reported as damage.
    for args in (("verify", folder), ("import", folder, "--out", str(tmp_path / "imp"), "--world-size", "2")):
        run = cli(*args)
        assert run.returncode != 0 and "serialization_format=SAFETENSORS" in run.stderr, run.stderr
        assert "damage" not in (run.stdout + run.stderr).lower() and "DataLoss" not in run.stderr, run.stderr
    with pytest.raises(shardckpt.ShardckptError) as error:
        shardckpt.verify(folder)
    assert not isinstance(error.value, shardckpt.DataLoss) and "SAFETENSORS" in error.value.message


def test_negative_and_conjugate_views_are_refused_not_read_negated(tmp_path):
    # dcp.save keeps a view's neg or conj bit in its chunk's pickle, over the storage's values
    # before negation: read as they are, every sign would be wrong; refused, naming the tensor.
    import torch.distributed.checkpoint as dcp
    x = torch.tensor([1.0, -2.0, 3.0])
    for name, view, word in (("neg", torch._neg_view(x), "a negative view"),
                             ("conj", torch.tensor([1 + 2j], dtype=torch.complex64).conj(), "a conjugate view")):
        folder = str(tmp_path / name)
        dcp.save({"w": x.clone(), name: view}, checkpoint_id=folder, no_dist=True)
        run = cli("consolidate", folder, "--out", str(tmp_path / (name + ".pt")))
        assert run.returncode == 1 and ("'%s'" % name) in run.stderr and word in run.stderr, run.stderr
        assert "resolve_neg().resolve_conj()" in run.stderr and not os.path.exists(str(tmp_path / (name + ".pt")))
        with pytest.raises(shardckpt.ShardckptError) as error:
            shardckpt.load({"w": torch.zeros(3), name: torch.zeros_like(view.resolve_neg().resolve_conj())}, folder)
        assert word in error.value.message and not isinstance(error.value, shardckpt.DataLoss), error.value.message


def test_empty_bool_and_permuted_tensors_read(tmp_path):
    import torch.distributed.checkpoint as dcp
    state = {"e": torch.empty(0, 5), "z": torch.zeros(3, 0), "b": torch.tensor([True, False, True])}
    dcp.save(state, checkpoint_id=str(tmp_path / "ok"), no_dist=True)
    shardckpt.consolidate(str(tmp_path / "ok"), str(tmp_path / "ok.pt"))
    assert_equal_state(state, torch.load(tmp_path / "ok.pt", weights_only=True))
    # dcp.save keeps a view's strides (a transposed weight is saved transposed): each is read in
    # the boxes that are row-major in its record.
    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    permuted = {"t": torch.arange(6.0).reshape(2, 3).t(), "p": base.permute(2, 0, 3, 1), "q": base.permute(0, 2, 1, 3),
                "ones": torch.arange(6.0).reshape(2, 1, 3).permute(2, 1, 0)}
    assert all(not v.is_contiguous() for v in permuted.values())
    dcp.save(permuted, checkpoint_id=str(tmp_path / "strided"), no_dist=True)
    shardckpt.consolidate(str(tmp_path / "strided"), str(tmp_path / "s.pt"))
    assert_equal_state({k: v.contiguous() for k, v in permuted.items()}, torch.load(tmp_path / "s.pt", weights_only=True))
    run = cli("verify", str(tmp_path / "strided"))
    assert run.returncode == 0, run.stdout + run.stderr
    # Resharded to 3 ranks and back: the pieces cut across the boxes come out whole.
    report = shardckpt.import_checkpoint(str(tmp_path / "strided"), str(tmp_path / "root"), 3, "dim0")
    shardckpt.consolidate(report["path"], str(tmp_path / "back.pt"))
    assert_equal_state({k: v.contiguous() for k, v in permuted.items()}, torch.load(tmp_path / "back.pt", weights_only=True))


def test_load_resharded_at_three_ranks(comm):
    """Saved by 2 ranks in Shard(0)/Shard(1) boxes, loaded as flat ranges at 3."""
    expected = full_tensors("dist")
    target, mine = {}, {}
    for name, full in expected.items():
        if full.dim() >= 2:
            n = full.numel()
            begin = n * comm.rank // comm.size
            end = n * (comm.rank + 1) // comm.size
            local = torch.zeros(end - begin, dtype=full.dtype)
            target[name] = shardckpt.FlatShard(local, list(full.shape), begin)
            mine[name] = (local, full.reshape(-1)[begin:end])
        else:
            target[name] = torch.zeros_like(full)
            mine[name] = (target[name], full)
    # DCP's byte items come back through torch.load(weights_only=True).
    target["epoch"], target["tags"] = None, None
    nested = {"opt": {"exp_avg": target.pop("opt.exp_avg"), "meta": {"betas": target.pop("opt.meta.betas")}}}
    target.update(nested)
    report = shardckpt.load(target, os.path.join(DATA, "dist"))
    assert report.saved_world_size == 2 and report.missing == [] and report.unexpected == []
    assert target["epoch"] == 3 and target["tags"] == ["a", "b"]
    for name, (got, want) in mine.items():
        assert torch.equal(got, want), name
