"""FSDP2 (fully_shard) model + AdamW state from get_state_dict, saved by 4 processes and loaded
back with set_state_dict by 2, by 3 (FSDP2 again) and by 1 process (a plain model: full
tensors), every value compared with what was saved. Phases as in test_reshard.py:
SHARDCKPT_PY_PHASE=save under torchrun:4, then =load under torchrun:2, :3 and :1 on the folder."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor")
pytest.importorskip("shardckpt._core")  # not built: skipped, exit 77 (conftest.py)
import shardckpt  # noqa: E402
import torch.distributed as dist  # noqa: E402
from conftest import barrier  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

PHASE = os.environ.get("SHARDCKPT_PY_PHASE", "")
WORK = os.environ.get("SHARDCKPT_PY_WORK", "/tmp/shardckpt-pytest")
ROOT = os.path.join(WORK, "ckpt")
REFERENCE = os.path.join(WORK, "reference.pt")


def build(sharded):
    """Odd sizes so that 4 ranks get uneven and empty shards (5 rows: 2,2,1,0; 3 rows: 1,1,1,0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(3, 4), torch.nn.Linear(4, 5),
                                torch.nn.Tanh(), torch.nn.Linear(5, 2))
    if sharded and dist.is_initialized():
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        fully_shard(model)
    # A different lr than the one saved: set_state_dict must bring the saved one back.
    optim = torch.optim.AdamW(model.parameters(), lr=0.5 if PHASE == "load" else 0.01,
                              betas=(0.8, 0.95), weight_decay=0.1)
    return model, optim


def train(model, optim, steps):
    for step in range(steps):
        x = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]]) + 0 * step
        loss = model(x).pow(2).mean() * (step + 1)
        loss.backward()
        optim.step()
        optim.zero_grad()


def full_values(state, prefix=""):
    """Every tensor of a nested state as a full tensor by dotted name; other leaves as they are."""
    out = {}
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for key, value in items:
        name = "%s.%s" % (prefix, key) if prefix else str(key)
        if isinstance(value, DTensor):
            out[name] = value.full_tensor().clone()
        elif isinstance(value, torch.Tensor):
            out[name] = value.clone()
        elif isinstance(value, (dict, list)) and any(isinstance(v, (dict, list, torch.Tensor))
                                                     for v in (value.values() if isinstance(
                                                         value, dict) else value)):
            out.update(full_values(value, name))
        else:
            out[name] = value
    return out


@pytest.mark.skipif(PHASE != "save", reason="save phase only")
def test_save_fsdp2_model_and_optimizer(comm):
    model, optim = build(sharded=True)
    train(model, optim, 3)
    model_sd, optim_sd = get_state_dict(model, optim)
    assert any(isinstance(v, DTensor) for v in model_sd.values()) or comm.size == 1
    state = {"model": model_sd, "optim": optim_sd}
    shardckpt.save(state, ROOT, step=3)
    reference = full_values(state)
    if comm.rank == 0:
        torch.save(reference, REFERENCE)
    barrier(comm)
    assert any(k.endswith(".exp_avg_sq") for k in reference)
    assert any(k.endswith(".step") for k in reference)


@pytest.mark.skipif(PHASE != "load", reason="load phase only")
def test_load_with_set_state_dict_at_another_world_size(comm):
    sharded = comm.size > 1
    model, optim = build(sharded)
    model_sd, optim_sd = get_state_dict(model, optim)  # initializes the optimizer's state
    state = {"model": model_sd, "optim": optim_sd}
    report = shardckpt.load(state, ROOT)
    assert report.saved_world_size == 4 and report.step == 3
    assert report.missing == [] and report.unexpected == []
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert optim.param_groups[0]["lr"] == 0.01 and optim.param_groups[0]["betas"] == (0.8, 0.95)
    reference = torch.load(REFERENCE, weights_only=True)
    got = full_values(dict(zip(("model", "optim"), get_state_dict(model, optim))))
    assert sorted(got) == sorted(reference)
    for name, expected in reference.items():
        if isinstance(expected, torch.Tensor):
            assert got[name].dtype == expected.dtype and torch.equal(got[name], expected), name
        else:
            assert got[name] == expected, name
    # Training goes on from the loaded state as it would have from the saved one.
    train(model, optim, 1)
