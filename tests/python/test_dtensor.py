"""DTensor state under torchrun (gloo, CPU): Shard(d)/Replicate on 1-D and 2-D meshes, saved and
loaded in place into the DTensors' local tensors, resharded to other placements, and refused or
failed the same way on every rank. torch 2.x only."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor")
pytest.importorskip("shardckpt._core")  # not built: skipped, exit 77 (conftest.py)
import shardckpt  # noqa: E402
import torch.distributed as dist  # noqa: E402
from conftest import flip_byte  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402

# name -> (global shape, placements on a 1-D mesh). At 4 ranks: rows5 is 2,2,1,0 rows and rows2
# 1,1,0,0 (empty local shards), cols splits dim 1, rep and scalar are written once.
ONE_D = {"rows5": ((5, 3), [Shard(0)]), "rows2": ((2, 3), [Shard(0)]),
         "cols": ((3, 5), [Shard(1)]), "rep": ((4,), [Replicate()]), "scalar": ((), [Replicate()]),
         "cube": ((3, 2, 7), [Shard(2)])}


@pytest.fixture(scope="module")
def mesh(comm):
    if not dist.is_initialized():
        pytest.skip("DTensor needs torch.distributed (run under torchrun)")
    return init_device_mesh("cpu", (comm.size,))


def full(name, shape, dtype=torch.float32):
    """Distinct values, the same on every rank."""
    n = 1
    for d in shape:
        n *= d
    base = 1000 * (sum(map(ord, name)) % 97)
    return (torch.arange(n, dtype=torch.float64) + base).reshape(shape).to(dtype)


def dtensors(mesh, table, fill=True, dtype=torch.float32):
    return {name: distribute_tensor(full(name, shape, dtype) if fill else
                                    torch.zeros(shape, dtype=dtype), mesh, placements)
            for name, (shape, placements) in table.items()}


def assert_full(state, table, dtype=torch.float32):
    for name, (shape, _) in table.items():
        value = state[name]
        got = value.full_tensor() if isinstance(value, DTensor) else value
        assert torch.equal(got, full(name, shape, dtype)), name


def test_one_d_round_trip_in_place(comm, mesh, root):
    shardckpt.save({"m": dtensors(mesh, ONE_D)}, root, step=1)
    target = {"m": dtensors(mesh, ONE_D, fill=False)}
    pointers = {k: v.to_local().data_ptr() for k, v in target["m"].items()}
    report = shardckpt.load(target, root)
    assert report.missing == [] and report.unexpected == [] and report.saved_world_size == comm.size
    assert_full(target["m"], ONE_D)
    # In place: the same local storage, now holding this rank's part.
    assert {k: v.to_local().data_ptr() for k, v in target["m"].items()} == pointers
    # Replicated DTensors are written once, not once per rank.
    entries = {e["name"]: e for e in shardckpt.inspect(root)["entries"]}
    assert entries["m.rep"]["chunks"] == 1 and entries["m.scalar"]["shape"] == []
    assert entries["m.rows5"]["shape"] == [5, 3]


def test_one_d_reshards_to_other_placements_and_plain_tensors(comm, mesh, root):
    shardckpt.save(dtensors(mesh, ONE_D), root, step=1)
    other = {"rows5": ((5, 3), [Shard(1)]), "rows2": ((2, 3), [Replicate()]),
             "cols": ((3, 5), [Shard(0)]), "rep": ((4,), [Shard(0)]),
             "scalar": ((), [Replicate()]), "cube": ((3, 2, 7), [Shard(0)])}
    target = dtensors(mesh, other, fill=False)
    shardckpt.load(target, root)
    assert_full(target, other)
    plain = {name: torch.zeros(shape) for name, (shape, _) in ONE_D.items()}
    shardckpt.load(plain, root)
    assert_full(plain, ONE_D)


def test_plain_tensors_load_into_dtensors(comm, mesh, root):
    shardckpt.save({name: full(name, shape) for name, (shape, _) in ONE_D.items()}, root, step=1)
    target = dtensors(mesh, ONE_D, fill=False)
    shardckpt.load(target, root)
    assert_full(target, ONE_D)


TWO_D = {"fsdp_tp": ((7, 6), [Shard(0), Shard(1)]), "nested": ((7, 6), [Shard(0), Shard(0)]),
         "nested_cols": ((3, 9), [Shard(1), Shard(1)]), "tp_only": ((5, 4), [Replicate(), Shard(1)]),
         "dp_only": ((5, 4), [Shard(0), Replicate()]), "small": ((3, 2), [Shard(0), Shard(0)]),
         "rep": ((6,), [Replicate(), Replicate()])}


def test_two_d_mesh_fsdp_by_tp(comm, mesh, root):
    if comm.size != 4:
        pytest.skip("a 2x2 mesh needs 4 ranks")
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    shardckpt.save(dtensors(mesh2, TWO_D), root, step=1)
    same = dtensors(mesh2, TWO_D, fill=False)
    shardckpt.load(same, root)
    assert_full(same, TWO_D)
    # Into other 2-D placements and onto the 1-D mesh.
    swapped = {name: (shape, list(reversed(p))) for name, (shape, p) in TWO_D.items()}
    target = dtensors(mesh2, swapped, fill=False)
    shardckpt.load(target, root)
    assert_full(target, swapped)
    flat = {name: (shape, [Shard(0)] if shape[0] else [Replicate()]) for name, (shape, _) in
            TWO_D.items()}
    target = dtensors(mesh, flat, fill=False)
    shardckpt.load(target, root)
    assert_full(target, flat)
    entries = {e["name"]: e for e in shardckpt.inspect(root)["entries"]}
    assert entries["rep"]["chunks"] == 1 and entries["tp_only"]["chunks"] == 2


def test_non_contiguous_local_tensors(comm, mesh, root):
    # Each rank's local part is a transposed view: saved by value, loaded back through it.
    rows = 2 * comm.size
    whole = full("nc", (rows, 3))
    local = whole[2 * comm.rank: 2 * comm.rank + 2].t().contiguous().t()
    assert not local.is_contiguous()
    value = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=(rows, 3),
                               stride=(3, 1))
    assert not value.to_local().is_contiguous()
    shardckpt.save({"nc": value}, root, step=1)
    plain = {"nc": torch.zeros(rows, 3)}
    shardckpt.load(plain, root)
    assert torch.equal(plain["nc"], whole)
    into = torch.zeros(3, 2).t()
    target = DTensor.from_local(into, mesh, [Shard(0)], run_check=False, shape=(rows, 3),
                                stride=(3, 1))
    shardckpt.load({"nc": target}, root)
    assert torch.equal(target.to_local(), whole[2 * comm.rank: 2 * comm.rank + 2])
    assert torch.equal(into, whole[2 * comm.rank: 2 * comm.rank + 2])  # the caller's storage


def test_partial_is_refused_on_every_rank_naming_the_key(comm, mesh, root):
    pending = DTensor.from_local(torch.ones(3), mesh, [Partial()], run_check=False)
    with pytest.raises(shardckpt.Unimplemented) as error:
        shardckpt.save({"grads": {"w": pending}}, root, step=1)
    assert "'grads.w'" in error.value.message and "Partial" in error.value.message
    assert not os.path.exists(os.path.join(root, "step-000000001"))


def test_a_rank_whose_dtensor_is_inconsistent_fails_every_rank(comm, mesh, root):
    # The last rank's local tensor does not match its placement: it fails before the collective,
    # and every rank raises the same class, naming the tensor and the rank.
    bad = comm.rank == comm.size - 1
    local = torch.zeros(3 if bad else 2, 4)
    value = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                               shape=(2 * comm.size, 4), stride=(4, 1))
    with pytest.raises(shardckpt.InvalidArgument) as error:
        shardckpt.save({"layer": {"w": value}, "ok": torch.ones(2)}, root, step=1)
    assert "'layer.w'" in error.value.message
    assert "rank %d" % (comm.size - 1) in error.value.message
    assert not os.path.exists(os.path.join(root, "step-000000001"))


@pytest.mark.parametrize("wrong", ["dtype", "shape"])
def test_wrong_dtype_or_shape_into_a_dtensor(comm, mesh, root, wrong):
    shardckpt.save({"w": dtensors(mesh, {"w": ((5, 3), [Shard(0)])})["w"]}, root, step=1)
    table = {"w": ((5, 3) if wrong == "dtype" else (6, 3), [Shard(0)])}
    target = dtensors(mesh, table, fill=False, dtype=torch.float64 if wrong == "dtype" else
                      torch.float32)
    with pytest.raises(shardckpt.InvalidArgument) as error:
        shardckpt.load(target, root)
    assert "entry 'w'" in error.value.message
    assert ("float64" if wrong == "dtype" else "[6, 3]") in error.value.message


def test_a_per_rank_dtensor_is_refused_by_name(comm, mesh, root):
    value = dtensors(mesh, {"w": ((4,), [Shard(0)])})["w"]
    with pytest.raises(shardckpt.InvalidArgument) as error:
        shardckpt.save({"rng": shardckpt.PerRank(value)}, root, step=1)
    assert "'rng'" in error.value.message and "to_local()" in error.value.message


def test_missing_key_is_named(comm, mesh, root):
    shardckpt.save(dtensors(mesh, {"w": ((5, 3), [Shard(0)])}), root, step=1)
    target = dtensors(mesh, {"w": ((5, 3), [Shard(0)]), "extra": ((4,), [Shard(0)])}, fill=False)
    with pytest.raises(shardckpt.NotFound) as error:
        shardckpt.load(target, root)
    assert "extra" in error.value.message
    report = shardckpt.load(target, root, strict=False)
    assert report.missing == ["extra"] and torch.equal(target["w"].full_tensor(),
                                                       full("w", (5, 3)))


def test_corrupt_data_file_is_data_loss_on_every_rank(comm, mesh, root):
    shardckpt.save(dtensors(mesh, {"big": ((64, 64), [Shard(0)])}), root, step=1)
    data = os.path.join(root, "step-000000001", "rank-00000.bin")
    flip_byte(comm, data)
    # Every rank loads the whole tensor, so every rank reads the damaged block.
    target = dtensors(mesh, {"big": ((64, 64), [Replicate()])}, fill=False)
    with pytest.raises(shardckpt.DataLoss) as error:
        shardckpt.load(target, root)
    assert "rank-00000.bin" in error.value.message


def test_async_save_keeps_the_values_at_call_time(comm, mesh, root):
    """DCP issue 144657: the state changed right after async_save returned must not leak into
    the checkpoint."""
    model = torch.nn.Linear(6, 5)
    from torch.distributed.fsdp import fully_shard
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 6)).sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "optim": optim.state_dict(),
             "extra": dtensors(mesh, ONE_D)}
    expected = {"w": model.weight.full_tensor().clone(),
                "avg": optim.state[model.weight]["exp_avg"].full_tensor().clone(),
                "step": optim.state[model.weight]["step"].clone()}
    handle = shardckpt.async_save(state, root, step=1)
    with torch.no_grad():
        for value in state["extra"].values():
            value.to_local().add_(1)
    optim.zero_grad()
    model(torch.ones(2, 6)).sum().backward()
    optim.step()  # changes the weights, exp_avg and step in place
    assert not torch.equal(model.weight.full_tensor(), expected["w"])
    handle.wait()
    target = {"model": {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in
                        model.state_dict().items()},
              "extra": {name: torch.zeros(shape) for name, (shape, _) in ONE_D.items()}}
    report = shardckpt.load(target, root, strict=False)
    assert torch.equal(target["model"]["weight"], expected["w"])
    assert_full(target["extra"], ONE_D)
    avg = torch.zeros(5, 6)
    step = torch.zeros(())
    # optim.state_dict() keys the state by parameter index: the weight is 0.
    report = shardckpt.load({"optim": {"state": {0: {"exp_avg": avg, "step": step}}}}, root,
                            strict=False)
    assert "optim.state.0.exp_avg" not in report.missing
    assert torch.equal(avg, expected["avg"]) and torch.equal(step, expected["step"])
    assert "optim.param_groups" in report.unexpected


def test_fsdp2_over_tensor_parallel_model(comm, mesh, root):
    """fully_shard over a TP-parallelized model on a 2x2 mesh: FSDP2 gives the column-parallel
    weights (_StridedShard(0), Shard(0)), uneven (5 rows per TP rank over 2 DP ranks); they load into a plain model and into
    a 1-D FSDP2 model, with the optimizer state."""
    if comm.size != 4:
        pytest.skip("a 2x2 mesh needs 4 ranks")
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5))

    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = build()
    parallelize_module(model, mesh2["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh2["dp"])
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(2, 6)).sum().backward()
    optim.step()
    assert "_StridedShard" in repr(model.state_dict()["0.weight"].placements)
    model_sd, optim_sd = get_state_dict(model, optim)
    shardckpt.save({"model": model_sd, "optim": optim_sd}, root, step=1)
    expected = {k: v.full_tensor() for k, v in model_sd.items()}
    expected_avg = {k: s["exp_avg"].full_tensor() for k, s in optim_sd["state"].items()}

    plain = build()
    plain_optim = torch.optim.AdamW(plain.parameters(), lr=0.5)
    p_model, p_optim = get_state_dict(plain, plain_optim)
    shardckpt.load({"model": p_model, "optim": p_optim}, root)
    set_state_dict(plain, plain_optim, model_state_dict=p_model, optim_state_dict=p_optim)
    for k, v in plain.state_dict().items():
        assert torch.equal(v, expected[k]), k
    for k, s in get_state_dict(plain, plain_optim)[1]["state"].items():
        assert torch.equal(s["exp_avg"], expected_avg[k]), k
    assert plain_optim.param_groups[0]["lr"] == 0.01

    flat = build()
    fully_shard(flat, mesh=mesh)
    target = {k: v for k, v in flat.state_dict().items()}
    shardckpt.load({"model": target}, root, strict=False)
    for k, v in target.items():
        assert torch.equal(v.full_tensor(), expected[k]), k
