"""DTensor local shards as the engine's Box layouts (torch 2.x; absent from torch 1.13).

A DTensor's local tensor is the part of the global tensor that its rank's mesh coordinate
selects: placements are applied mesh dim by mesh dim, left to right, each ``Shard(d)`` splitting
what earlier ones left of dim ``d`` with ``torch.chunk`` semantics (chunks of ceil(n/k), trailing
ones shorter or empty), so two ``Shard`` placements on one dim nest. ``Replicate()`` splits
nothing: the ranks along that mesh dim hold equal boxes, which the engine's save plan writes
once and every one of them loads. ``_StridedShard`` (FSDP2 over a TP-sharded dim) is followed
through torch's own index computation and accepted when the rows it selects are contiguous;
``Partial`` (pending reductions) is refused, naming the key.

:func:`local_box` is pure (plain shapes, coordinates and placements), so a table test can check
it against ``torch.distributed.tensor._utils.compute_local_shape_and_global_offset``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from .errors import InvalidArgument, Unimplemented

_DTENSOR: Optional[type] = None
_LOOKED = False


def dtensor_class() -> Optional[type]:
    """torch's DTensor class, or None where this torch has none (1.13)."""
    global _DTENSOR, _LOOKED
    if not _LOOKED:
        _LOOKED = True
        for module in ("torch.distributed.tensor", "torch.distributed._tensor"):
            try:
                _DTENSOR = getattr(__import__(module, fromlist=["DTensor"]), "DTensor")
                break
            except (ImportError, AttributeError):
                continue
    return _DTENSOR


def is_dtensor(value: Any) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(value, cls)


def _kind(placement: Any) -> str:
    """'replicate', 'shard', 'strided' or the class name of anything else (refused)."""
    name = type(placement).__name__
    if name == "_StridedShard":
        return "strided"
    if hasattr(placement, "is_replicate") and placement.is_replicate():
        return "replicate"
    if name == "Shard" or (hasattr(placement, "is_shard") and placement.is_shard()
                           and hasattr(placement, "dim")):
        return "shard"
    return name


def _chunk(indices: Sequence[int], parts: int, index: int) -> Sequence[int]:
    per = -(-len(indices) // parts) if parts > 0 else 0
    return indices[per * index: per * (index + 1)]


def local_box(name: str, global_shape: Sequence[int], mesh_shape: Sequence[int],
              coordinate: Sequence[int], placements: Sequence[Any]) -> Tuple[List[int], List[int]]:
    """(offsets, sizes) of the box of the global tensor that mesh ``coordinate`` holds.

    Raises :class:`Unimplemented` for a placement that is not Shard/Replicate (or a strided
    shard whose rows are not contiguous) and :class:`InvalidArgument` for a placement that does
    not fit the shape or mesh; both name ``name``."""
    if len(placements) != len(mesh_shape) or len(coordinate) != len(mesh_shape):
        raise InvalidArgument("'%s': %d placements for a %d-d device mesh" % (
            name, len(placements), len(mesh_shape)))
    rows: List[Sequence[int]] = [range(int(n)) for n in global_shape]
    for mesh_dim, placement in enumerate(placements):
        kind = _kind(placement)
        if kind == "replicate":
            continue
        if kind not in ("shard", "strided"):
            raise Unimplemented("'%s': DTensor placement %r on mesh dim %d is not supported "
                                "(Shard and Replicate are; call full_tensor() or redistribute "
                                "first)" % (name, placement, mesh_dim))
        dim = int(placement.dim)
        dim = dim + len(global_shape) if dim < 0 else dim
        if not 0 <= dim < len(global_shape):
            raise InvalidArgument("'%s': %r on a %d-d tensor" % (name, placement, len(global_shape)))
        parts, index = int(mesh_shape[mesh_dim]), int(coordinate[mesh_dim])
        if kind == "shard":
            rows[dim] = _chunk(rows[dim], parts, index)
        else:
            rows[dim] = _strided(name, placement, rows[dim], parts, index)
    offsets, sizes = [], []
    for dim, kept in enumerate(rows):
        contiguous = isinstance(kept, range) and kept.step == 1  # Shard only: no list built
        if len(kept) and not contiguous and list(kept) != list(range(kept[0], kept[0] + len(kept))):
            raise Unimplemented("'%s': its placements %r give this rank rows of dim %d that are "
                                "not contiguous; only contiguous local shards are supported" % (
                                    name, tuple(placements), dim))
        offsets.append(int(kept[0]) if len(kept) else 0)
        sizes.append(len(kept))
    return offsets, sizes


def _strided(name: str, placement: Any, rows: Sequence[int], parts: int, index: int) -> List[int]:
    """The rows a _StridedShard keeps, by torch's own computation (its semantics are torch's)."""
    try:
        from torch.distributed.tensor.placement_types import _StridedShardOffsetMode
        size, offsets = placement._local_shard_size_and_offset(
            len(rows), parts, index, offset_mode=_StridedShardOffsetMode.ALL)
    except Exception as error:  # a torch without this helper: refuse rather than guess
        raise Unimplemented("'%s': DTensor placement %r is not supported by this torch (%s)" % (
            name, placement, error)) from None
    picked = [rows[int(i)] for i in (offsets or [])]
    if len(picked) != int(size):
        raise Unimplemented("'%s': cannot follow placement %r" % (name, placement))
    return picked


def dtensor_piece(name: str, value: Any) -> Tuple[torch.Tensor, List[int], Tuple[str, Any, Any]]:
    """(local tensor, global shape, layout) of a DTensor: the layout is ("box", offsets, sizes),
    or ("replicated",) when the box is the whole tensor. The local tensor is the DTensor's own
    storage (writing into it updates the DTensor)."""
    mesh = value.device_mesh
    coordinate = mesh.get_coordinate()
    global_shape = [int(n) for n in value.shape]
    local = value._local_tensor if hasattr(value, "_local_tensor") else value.to_local()
    if coordinate is None:  # this rank is outside the mesh: it holds nothing of it
        return local, global_shape, ("box", [0] * len(global_shape), [0] * len(global_shape))
    offsets, sizes = local_box(name, global_shape, list(mesh.shape), list(coordinate),
                               list(value.placements))
    if list(local.shape) != sizes:
        raise InvalidArgument("'%s': the DTensor's local tensor has shape %s but its placements "
                              "%r give this rank %s of the global %s" % (
                                  name, list(local.shape), tuple(value.placements), sizes,
                                  global_shape))
    if sizes == global_shape:
        return local, global_shape, ("replicated", None, None)
    return local, global_shape, ("box", offsets, sizes)
