"""DTensor placements to Box layouts (shardckpt/_dtensor.py), by table, against torch's own
compute_local_shape_and_global_offset for every mesh coordinate. One process, torch 2.x."""

import itertools

import pytest

torch = pytest.importorskip("torch")
tensor_api = pytest.importorskip("torch.distributed.tensor")
pytest.importorskip("shardckpt._core")
import shardckpt  # noqa: E402
from shardckpt._dtensor import local_box  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset  # noqa: E402
from torch.distributed.tensor.placement_types import Partial, _StridedShard  # noqa: E402

CASES = [
    # (global shape, mesh shape, placements)
    ((5, 3), (4,), (Shard(0),)),                 # uneven: 2, 2, 1, 0 rows
    ((2, 3), (4,), (Shard(0),)),                 # empty shards on ranks 2 and 3
    ((0, 3), (2,), (Shard(0),)),                 # an empty tensor
    ((3, 5), (4,), (Shard(1),)),
    ((4,), (4,), (Replicate(),)),
    ((), (2,), (Replicate(),)),                  # a 0-d tensor (optimizer step)
    ((7, 6), (2, 2), (Shard(0), Shard(1))),      # FSDP2 x TP, different dims
    ((7, 6), (2, 2), (Shard(0), Shard(0))),      # two Shards on one dim: nested chunking
    ((9, 5), (2, 2), (Shard(1), Shard(1))),
    ((3, 4), (2, 2), (Shard(0), Shard(0))),      # nested and uneven: some empty
    ((7, 6), (2, 2), (Replicate(), Shard(1))),   # TP only, replicated over DP
    ((7, 6), (2, 2), (Shard(0), Replicate())),
    ((5, 2, 3), (2, 3), (Shard(2), Shard(0))),
]


@pytest.mark.parametrize("shape,mesh,placements", CASES)
def test_box_matches_torch_for_every_coordinate(shape, mesh, placements):
    boxes = []
    for coordinate in itertools.product(*[range(n) for n in mesh]):
        offsets, sizes = local_box("w", shape, mesh, coordinate, placements)
        torch_sizes, torch_offsets = _compute_local_shape_and_global_offset(
            shape, mesh, list(coordinate), placements)
        assert sizes == list(torch_sizes), coordinate
        if all(sizes):  # torch puts an empty shard at the end of its dim; we put it at 0
            assert offsets == list(torch_offsets), coordinate
        boxes.append((tuple(offsets), tuple(sizes)))
    # The distinct boxes tile the tensor exactly once.
    seen = torch.zeros(shape, dtype=torch.int64)
    for offsets, sizes in set(boxes):
        index = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        seen[index] += 1
    assert bool((seen == 1).all())


def test_strided_shard_of_fsdp2_over_tp_is_contiguous():
    # fully_shard over a TP-sharded dim 0: _StridedShard(0, split_factor=2) on DP, Shard(0) on TP.
    placements = (_StridedShard(0, split_factor=2), Shard(0))
    got = {c: local_box("w", (8, 3), (2, 2), c, placements) for c in
           itertools.product(range(2), range(2))}
    # TP rank t holds rows [4t, 4t+4); DP rank d the half d of that.
    assert got[(0, 0)] == ([0, 0], [2, 3]) and got[(1, 0)] == ([2, 0], [2, 3])
    assert got[(0, 1)] == ([4, 0], [2, 3]) and got[(1, 1)] == ([6, 0], [2, 3])


def test_interleaved_rows_are_refused_by_name():
    # Shard(0) then _StridedShard on the same dim: every other row, not a box.
    with pytest.raises(shardckpt.Unimplemented, match="'layers.0.w'.*not contiguous"):
        local_box("layers.0.w", (8, 3), (2, 2), (0, 0), (Shard(0), _StridedShard(0, split_factor=2)))


def test_partial_is_refused_by_name():
    with pytest.raises(shardckpt.Unimplemented, match="'grad'.*Partial"):
        local_box("grad", (4,), (2,), (0,), (Partial(),))


def test_placements_that_do_not_fit_are_refused_by_name():
    with pytest.raises(shardckpt.InvalidArgument, match="'b'"):
        local_box("b", (4,), (2,), (0,), (Shard(1),))
    with pytest.raises(shardckpt.InvalidArgument, match="'b'.*2 placements for a 1-d"):
        local_box("b", (4,), (2,), (0,), (Shard(0), Shard(0)))
