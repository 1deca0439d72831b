"""A nested state dict as the engine sees it: named tensor pieces and typed blobs.

Names are the dotted paths of the nesting (``model.layers.0.weight``; int keys and list indices
as digits). A dict, list or tuple holding no tensor anywhere is one blob; one holding tensors is
walked. Blobs are never pickled: a one-byte tag after a NUL says how they are stored.
"""

from __future__ import annotations

import base64
import copy
import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .errors import DataLoss, InvalidArgument

_JSON = b"\x00J"    # typed JSON (see _encode_json)
_BYTES = b"\x00B"   # raw bytes
_BYTEARRAY = b"\x00b"  # raw bytes of a bytearray (restored as one, so its type survives)
_TENSOR = b"\x00T"  # one JSON header line {"dtype", "shape"}, then the raw bytes (PerRank tensors)
_TAG = "__shardckpt__"


class FlatShard:
    """A rank's flat range of a tensor (FSDP1 flat parameters, ZeRO partitions).

    ``local`` holds elements ``[begin, begin + local.numel())`` of the row-major flattened tensor
    of ``global_shape``. Loading at another world size (or into plain tensors) reshards.
    """

    def __init__(self, local: torch.Tensor, global_shape: Sequence[int], begin: int) -> None:
        if not isinstance(local, torch.Tensor):
            raise InvalidArgument("FlatShard needs a tensor, not %s" % type(local).__name__)
        self.local = local
        self.global_shape = [int(d) for d in global_shape]
        self.begin = int(begin)

    def __repr__(self) -> str:
        return "FlatShard(numel=%d, global_shape=%s, begin=%d)" % (
            self.local.numel(), self.global_shape, self.begin)


class PerRank:
    """A value each rank has its own of (an RNG state): saved per rank, restored by rank at the
    same world size; at another world size it is left as it is and reported unavailable."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "PerRank(%r)" % (self.value,)


def _dtype_names() -> Dict[torch.dtype, str]:
    names = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
             torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
             torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
             torch.complex64: "complex64", torch.complex128: "complex128"}
    # float8 since torch 2.1, uint16/32/64 since 2.3: the engine's names are torch's.
    for attr in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
        if hasattr(torch, attr):
            names[getattr(torch, attr)] = attr
    return names


DTYPE_NAMES = _dtype_names()
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def dtype_name(tensor: torch.Tensor, name: str) -> str:
    try:
        return DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise InvalidArgument("'%s': dtype %s cannot be saved (supported: %s)" % (
            name, tensor.dtype, ", ".join(sorted(DTYPES)))) from None


def is_tensorish(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, FlatShard, PerRank))


class _HoldsItself(Exception):
    """A dict, list or tuple met again inside itself (walked, it would recurse for ever)."""


def _holds_tensors(value: Any, on_path: Optional[set] = None) -> bool:
    if is_tensorish(value):
        return True
    if not isinstance(value, (dict, list, tuple)):
        return False
    on_path = set() if on_path is None else on_path
    if id(value) in on_path:
        raise _HoldsItself()
    on_path.add(id(value))
    children = value.values() if isinstance(value, dict) else value
    held = any(_holds_tensors(v, on_path) for v in children)
    on_path.discard(id(value))
    return held


def check_unicode(text: str, what: Callable[[], str]) -> None:
    """Refuses a str that is not valid Unicode: a lone surrogate, as ``os.fsdecode`` makes of
    file-name bytes that are not UTF-8. The checkpoint's other readers (consolidate, DCP export,
    the C++ engine) take UTF-8 only; ``what()`` says where it is, ascii-escaped."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("%s %s is not valid Unicode (it holds a lone surrogate, as os.fsdecode makes of "
                              "bytes that are not UTF-8); a checkpoint holds UTF-8 only: re-encode it, or keep "
                              "such a path as bytes (os.fsencode)" % (what(), ascii(text))) from None


def walk(state: Any, prefix: str = "", paths: Optional[Dict[str, list]] = None) -> List[Tuple[str, Any]]:
    """(name, leaf) for every tensor, FlatShard, PerRank and blob-able value, in order. With
    ``paths``, also where each leaf below the top sat, as the manifest records it for
    consolidation (engine/formats/state_tree.h, "torch_paths"): name -> steps, each a dict key
    (str), {"int": key} (an int dict key), a list index (int) or {"tuple": index}."""
    if prefix == "" and not isinstance(state, dict):
        raise InvalidArgument("a state dict must be a dict, not %s" % type(state).__name__)
    out: List[Tuple[str, Any]] = []
    seen: Dict[str, bool] = {}
    on_path: set = set()  # the containers being walked: one met again inside itself is a cycle
    steps: list = []  # to the value being visited

    def visit(value: Any, name: str, top: bool = False) -> None:
        # The state dict itself is always walked, tensors or not: its values have names.
        try:  # on the walk's own path: a container met inside itself, below here or above
            leaf = not top and (is_tensorish(value) or not _holds_tensors(value, on_path))
        except _HoldsItself:
            raise InvalidArgument("'%s' holds itself (a dict or list inside itself): a state dict is a tree"
                                  % (name or "the state dict")) from None
        if leaf:
            if name in seen:
                raise InvalidArgument("two values are named '%s': a dotted key and a nested dict, or "
                                      "an int key and its string, flatten to the same name" % name)
            seen[name] = True
            out.append((name, value))
            if paths is not None and (len(steps) > 1 or (steps and not isinstance(steps[0], str))):
                paths[name] = list(steps)
            return
        on_path.add(id(value))
        is_dict = isinstance(value, dict)
        items = value.items() if is_dict else enumerate(value)
        for key, child in items:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise InvalidArgument("'%s': key %a is neither a str nor an int" % (name, key))
            if isinstance(key, str):
                check_unicode(key, lambda: "a key" + (" of '%s'" % name if name else ""))
            if is_dict:
                steps.append(key if isinstance(key, str) else {"int": key})
            else:
                steps.append({"tuple": key} if isinstance(value, tuple) else key)
            visit(child, "%s.%s" % (name, key) if name else str(key))
            steps.pop()
        on_path.discard(id(value))

    visit(state, prefix, True)
    return out


def restore(state: Any, values: Dict[str, Any], prefix: str = "") -> Any:
    """Puts ``values`` (by name) back into the nesting of ``state``, in place where it can
    (dicts, lists); tuples are rebuilt. Returns the new value of ``state``."""

    def visit(value: Any, name: str, top: bool = False) -> Any:
        if not top and (is_tensorish(value) or not _holds_tensors(value)):
            return values.get(name, value)
        if isinstance(value, dict):
            for key in list(value.keys()):
                value[key] = visit(value[key], "%s.%s" % (name, key) if name else str(key))
            return value
        children = [visit(child, "%s.%s" % (name, i) if name else str(i))
                    for i, child in enumerate(value)]
        if isinstance(value, list):
            value[:] = children
            return value
        return type(value)(*children) if hasattr(value, "_fields") else type(value)(children)

    return visit(state, prefix, True)


def _dcp_terminal(value: Any) -> bool:
    """Whether DCP's flattening (torch.distributed.checkpoint._traverse) stores ``value`` as one
    leaf: anything but a dict, and a list unless it holds a dict (or such a list)."""
    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    return all(not isinstance(e, (Mapping, list)) or _dcp_terminal(e) for e in value)


def dcp_stores_nothing_of(value: Any) -> bool:
    """An empty dict, or a dict (or a list DCP walks) of only those (a disabled GradScaler's
    state_dict(), an empty hooks dict, ``[{}]``): PyTorch DCP flattens it to no item at all, and
    dcp.load leaves it as it is."""
    if isinstance(value, Mapping):
        return all(dcp_stores_nothing_of(v) for v in value.values())
    return isinstance(value, list) and not _dcp_terminal(value) and all(dcp_stores_nothing_of(v) for v in value)


def _param_groups(name: str, value: Any) -> Optional[List[List[Any]]]:
    """The parameters of each group, when ``value`` is an optimizer's ``param_groups`` (named so,
    a list of dicts that each hold a "params" list: torch's, with indices, or get_state_dict's,
    with names); None for anything else (a user's list of dicts with "params" keys included)."""
    if name.rsplit(".", 1)[-1] != "param_groups" or not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(isinstance(g, Mapping) and isinstance(g.get("params"), (list, tuple)) for g in value):
        return None
    return [list(g["params"]) for g in value]


def param_groups_differ(name: str, saved: Any, current: Any) -> Optional[str]:
    """Why the saved ``param_groups`` cannot replace ``current`` (the optimizer the job built),
    or None. A value is replaced whole, so an optimizer built with other groups than the saved
    run's got the saved groups instead: set_state_dict accepted one group for two and the next
    step raised KeyError 'betas', or two groups for one and weight decay silently changed.
    torch's own Optimizer.load_state_dict refuses both; so does this. Not seen: groups whose
    settings are tensors (a tensor lr), which are saved leaf by leaf, not as one value."""
    if isinstance(saved, Mapping) and isinstance(current, Mapping):  # an optimizer saved as one value
        for key in saved:
            if key in current:
                why = param_groups_differ("%s.%s" % (name, key), saved[key], current[key])
                if why is not None:
                    return why
        return None
    mine, theirs = _param_groups(name, current), _param_groups(name, saved)
    if mine is None or theirs is None:
        return None
    if len(mine) == len(theirs) and all(len(a) == len(b) for a, b in zip(mine, theirs)):
        named = all(isinstance(p, str) for group in mine + theirs for p in group)
        moved = [i for i, (a, b) in enumerate(zip(mine, theirs)) if named and set(a) != set(b)]
        if not moved:
            return None
        i = moved[0]
        extra = sorted(set(map(str, theirs[i])) - set(map(str, mine[i])))[:3]
        detail = ("its parameter group %d holds other parameters than this optimizer's%s"
                  % (i, " (%s among them)" % ", ".join("'%s'" % p for p in extra) if extra else ""))
    else:
        def counted(groups: List[List[Any]]) -> str:
            return "%d parameter group%s (of %s parameters)" % (
                len(groups), "" if len(groups) == 1 else "s", " + ".join(str(len(g)) for g in groups))
        detail = "the checkpoint's optimizer has %s, this one %s" % (counted(theirs), counted(mine))
    return ("'%s': %s: loaded, the saved groups' settings (lr, weight_decay, ...) would go to other "
            "parameters" % (name, detail))


def dcp_leaves(name: str, current: Any, saved: Mapping[str, Any]) -> Optional[List[str]]:
    """The saved names that hold ``current`` piece by piece, or None.

    PyTorch DCP flattens a list or dict of plain values into one byte item per leaf
    (``optim.param_groups.0.lr``, ``optim.param_groups.0.betas``) where shardckpt keeps the
    whole value as one blob (``optim.param_groups``): a DCP folder's items are regrouped along
    the nesting of the value being loaded, or the value is missing if any leaf is."""
    if name in saved:
        return [name]
    if dcp_stores_nothing_of(current):
        return []  # nothing of it stored: matched by nothing (the engine says whether that holds)
    if isinstance(current, dict) and current:
        items = [("%s.%s" % (name, k), v) for k, v in current.items()]
    elif isinstance(current, (list, tuple)) and current:
        items = [("%s.%d" % (name, i), v) for i, v in enumerate(current)]
    else:
        return None
    leaves: List[str] = []
    for child_name, child in items:
        found = dcp_leaves(child_name, child, saved)
        if found is None:
            return None
        leaves += found
    return leaves


def dcp_leaf_names(name: str, value: Any) -> List[str]:
    """The names PyTorch DCP gives the leaves of a plain value when it flattens it
    (torch.distributed.checkpoint._traverse): dicts are always walked, a list only when it holds
    a dict (or such a list), anything else (a tuple included) is one leaf; an empty dict has none.
    The engine's strict match takes a value stored that way only when all of these are there."""
    out: List[str] = []

    def visit(path: str, v: Any) -> None:
        if isinstance(v, Mapping):
            for k, child in v.items():
                visit("%s.%s" % (path, k), child)
        elif _dcp_terminal(v):
            out.append(path)
        else:
            for i, child in enumerate(v):
                visit("%s.%d" % (path, i), child)

    if isinstance(value, (Mapping, list)):
        visit(name, value)
    return out if out != [name] else []


def regroup(name: str, current: Any, saved: Mapping[str, Any], leaf: Callable[[str, Any], Any]) -> Any:
    """``current`` rebuilt from the saved leaves dcp_leaves found: leaf(saved name, old value),
    its containers of ``current``'s classes (an OrderedDict, a namedtuple) where they agree."""
    if name in saved:
        return leaf(name, current)
    if isinstance(current, dict):
        built: Any = {k: regroup("%s.%s" % (name, k), v, saved, leaf) for k, v in current.items()}
    else:
        children = [regroup("%s.%d" % (name, i), v, saved, leaf) for i, v in enumerate(current)]
        built = tuple(children) if isinstance(current, tuple) else children
    return _shaped_like(current, built)


def _encode_json(value: Any, name: str) -> Any:
    if isinstance(value, str):
        check_unicode(value, lambda: "'%s': the string" % name)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        value = int(value)
        if -2 ** 63 <= value < 2 ** 64:
            return value
        # Wider than JSON readers keep exactly (C++'s would make it a float): its bytes, tagged.
        width = (value.bit_length() + 8) // 8
        return {_TAG: "int", "v": value.to_bytes(width, "little", signed=True).hex()}
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {_TAG: "float", "v": repr(float(value))}
    if isinstance(value, (bytes, bytearray)):
        kind = "bytearray" if isinstance(value, bytearray) else "bytes"
        return {_TAG: kind, "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "v": [_encode_json(v, name) for v in value]}
    if isinstance(value, list):
        return [_encode_json(v, name) for v in value]
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, str):
                check_unicode(key, lambda: "'%s': the key" % name)
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: _encode_json(v, "%s.%s" % (name, k)) for k, v in value.items()}
        return {_TAG: "dict", "v": [[_encode_json(k, name), _encode_json(v, "%s.%s" % (name, k))]
                                    for k, v in value.items()]}
    if isinstance(value, torch.Tensor):  # reached only inside a value: a PerRank's dict or list, a key
        raise InvalidArgument(
            "'%s': a tensor inside a value (a PerRank's dict or list, or a dict key) cannot be saved: "
            "a PerRank takes one tensor, or plain values; give each tensor a PerRank of its own (e.g. "
            "{'cpu': PerRank(cpu_state), 'cuda': PerRank(cuda_state)})" % name)
    # What to do instead, for the objects a training loop hands over most often.
    hint = ""
    if callable(getattr(value, "state_dict", None)):
        hint = "; pass its state_dict() (DCP's Stateful objects are saved that way), and load_state_dict() it after a load"
    elif type(value).__module__ == "numpy" or type(value).__module__.startswith("numpy."):
        hint = "; pass .tolist() (an RNG state: np.random.get_state() as a list), or torch.from_numpy() for an array of numbers"
    raise InvalidArgument(
        "'%s': a %s.%s cannot be saved: a state dict holds tensors, FlatShard, PerRank, and "
        "int/float/str/bool/None/bytes with lists, tuples and dicts of them%s" % (
            name, type(value).__module__, type(value).__qualname__, hint))


def _decode_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_json(v) for v in value]
    if isinstance(value, dict):
        tag = value.get(_TAG)
        if tag == "float":
            return float(value["v"])
        if tag == "bytes":
            return base64.b64decode(value["v"])
        if tag == "int":
            return int.from_bytes(bytes.fromhex(value["v"]), "little", signed=True)
        if tag == "bytearray":
            return bytearray(base64.b64decode(value["v"]))
        if tag == "tuple":
            return tuple(_decode_json(v) for v in value["v"])
        if tag == "dict":
            return {_hashable(_decode_json(k)): _decode_json(v) for k, v in value["v"]}
        return {k: _decode_json(v) for k, v in value.items()}
    return value


def _shaped_like(target: Any, value: Any) -> Any:
    """``value`` with the classes of ``target`` where they agree. JSON keeps ints, floats,
    strings, tuples and dicts but not their subclasses (an IntEnum, numpy's float64, a str Enum,
    a namedtuple, torch.Size, an OrderedDict, a defaultdict with its factory); the value being
    loaded into still has them. Where it has another class, the stored value is returned."""
    if value is None or isinstance(value, bool) or target is None or isinstance(target, bool):
        return value
    if isinstance(value, (int, float, str)):
        if type(target) is type(value) or not isinstance(target, type(value)):
            return value
        try:
            restored = type(target)(value)
        except Exception:  # noqa: BLE001 - a class that is not made from its value: the plain one
            return value
        same = restored == value or (restored != restored and value != value)  # NaN is NaN
        return restored if type(restored) is type(target) and same else value
    if isinstance(target, torch.Size) and isinstance(value, tuple):
        # A shape is one value whatever its length (a torch.Size([]) placeholder takes a saved
        # (2, 3) as torch.Size([2, 3])); items that are not int64s (a bool, 2**70) leave it a tuple.
        if all(type(v) is int and -(1 << 63) <= v < (1 << 63) for v in value):
            return torch.Size(value)
        return value
    if isinstance(target, tuple) and isinstance(value, tuple) and len(target) == len(value):
        items = [_shaped_like(t, v) for t, v in zip(target, value)]
        if type(target) is tuple:
            return tuple(items)
        try:
            return type(target)(*items) if hasattr(target, "_fields") else type(target)(items)
        except Exception:  # noqa: BLE001 - a class with its own __new__: the plain tuple, on every rank alike
            return tuple(items)
    if isinstance(target, (list, tuple)) and isinstance(value, (list, tuple)) and len(target) == len(value):
        return type(value)(_shaped_like(t, v) for t, v in zip(target, value))
    if isinstance(target, dict) and isinstance(value, dict):
        keys = {k: k for k in target}
        items = [(_key_like(keys.get(k), k), _shaped_like(dict.get(target, k), v)) for k, v in value.items()]
        plain = dict(items)
        if type(target) is dict:
            return plain
        try:
            restored = copy.copy(target)  # its class and state (a defaultdict's factory)
            if restored is target:
                return plain
            restored.clear()
            for k, v in items:
                restored[k] = v
        except Exception:  # noqa: BLE001 - a mapping that cannot be copied and refilled: a dict
            return plain
        # Only if it holds exactly the pairs (a Counter's update() would count them; a class with
        # other rules for setting items could change them): otherwise the plain dict.
        missing = object()
        if len(restored) != len(plain) or any(dict.get(restored, k, missing) is not v for k, v in items):
            return plain
        return restored
    return value


def _key_like(target_key: Any, key: Any) -> Any:
    """The target's key object for a stored key, where it is of a subclass of the stored key's
    type (an IntEnum key is stored as an int); else the stored key (1 stays 1 against True)."""
    if target_key is None or type(target_key) is type(key) or isinstance(target_key, (bool, tuple)) \
            or not isinstance(target_key, type(key)):
        return key  # a tuple key keeps its stored items (the target's may be True for 1)
    return target_key


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def host_values(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor holding the values of ``tensor`` (itself when it is one). A
    negative or conjugate view's memory holds the values before negation or conjugation;
    contiguous() keeps the flag, resolving writes the values (a copy only when a flag is set)."""
    view = tensor.detach()
    if view.device.type != "cpu":
        view = view.cpu()
    return view.resolve_neg().resolve_conj().contiguous()


def encode_blob(value: Any, name: str) -> bytes:
    """The stored bytes of a non-tensor value (or of a PerRank tensor)."""
    if isinstance(value, torch.Tensor):
        if type(value).__name__ == "DTensor":  # its bytes are this rank's part, not the value
            raise InvalidArgument("'%s': a DTensor inside PerRank cannot be saved; pass its "
                                  "to_local() (or save the DTensor itself)" % name)
        tensor = host_values(value)
        header = json.dumps({"dtype": dtype_name(tensor, name), "shape": list(tensor.shape)})
        raw = tensor.view(torch.uint8).numpy().tobytes() if tensor.dim() > 0 else \
            tensor.reshape(1).view(torch.uint8).numpy().tobytes()
        return _TENSOR + header.encode() + b"\n" + raw
    if isinstance(value, bytearray):
        return _BYTEARRAY + bytes(value)
    if isinstance(value, bytes):
        return _BYTES + value
    return _JSON + json.dumps(_encode_json(value, name), allow_nan=False).encode()


def decode_blob(data: bytes, name: str, target: Any = None) -> Any:
    """The value of stored blob bytes. A tensor blob is copied into ``target`` when that is a
    tensor of the same dtype and shape, else returned as a new tensor. Bytes without a tag (a
    blob written by the C++ API) come back as bytes."""
    try:
        if data.startswith(_BYTES):
            return data[len(_BYTES):]
        if data.startswith(_BYTEARRAY):
            return bytearray(data[len(_BYTEARRAY):])
        if data.startswith(_JSON):
            return _shaped_like(target, _decode_json(json.loads(data[len(_JSON):].decode())))
        if data.startswith(_TENSOR):
            header, raw = data[len(_TENSOR):].split(b"\n", 1)
            meta = json.loads(header.decode())
            dtype, shape = DTYPES[meta["dtype"]], [int(d) for d in meta["shape"]]
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
                torch.empty(0, dtype=torch.uint8)
            tensor = flat.view(dtype).reshape(shape)
            if isinstance(target, torch.Tensor) and target.dtype == dtype and \
                    list(target.shape) == shape:
                with torch.no_grad():
                    target.copy_(tensor)
                return target
            return tensor.clone()
    except (ValueError, KeyError, TypeError, RuntimeError, UnicodeDecodeError) as error:
        raise DataLoss("blob '%s' cannot be decoded: %s" % (name, error)) from None
    # A DCP folder's byte items reach here decoded by the engine (typed JSON, or tagged bytes).
    return bytes(data)
