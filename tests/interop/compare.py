"""Compares a consolidated file with the state dict make_state_dict.py wrote, bit for bit.

usage: compare.py ORIGINAL.pt CONSOLIDATED.(pt|safetensors)
.pt is loaded with torch.load(weights_only=True); .safetensors is read by this script with the
reference reader's rules (header length, JSON, offsets tiling the data exactly).
"""
import json
import struct
import sys

import torch

import make_state_dict  # noqa: F401  (same folder)

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + str(k) + "."))
        elif isinstance(v, torch.Tensor):
            out[prefix + str(k)] = v
    return out


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "header not padded to 8"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    assert header["__metadata__"]["format"] == "pt"
    out, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        spans.append((b, e))
        raw = bytearray(body[b:e])
        t = torch.frombuffer(raw, dtype=torch.uint8) if e > b else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(DTYPES[info["dtype"]]).reshape(info["shape"])
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, "gap or overlap in data_offsets"
        pos = e
    assert pos == len(body), "trailing bytes"
    return out


def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t


def main():
    raw = torch.load(sys.argv[1], weights_only=True)
    original = flatten(raw)
    path = sys.argv[2]
    if path.endswith(".safetensors"):
        got = read_safetensors(path)
    else:
        got = torch.load(path, weights_only=True)
        # Non-tensor values come back as values beside the tensors (unless the checkpoint went
        # through safetensors on the way, which holds tensors only).
        if "not_a_tensor" in got:
            assert got.pop("not_a_tensor") == raw["not_a_tensor"], got
        # Nested as the original where the chain kept its nesting (import of a .pt records it),
        # dotted names where it went through safetensors: compared by dotted name either way.
        assert isinstance(got, dict), type(got)
        got = flatten(got)
    assert isinstance(got, dict), type(got)
    assert set(got) == set(original), (sorted(set(got) ^ set(original)))
    for name, want in original.items():
        have = got[name]
        assert have.dtype == want.dtype, (name, have.dtype, want.dtype)
        assert tuple(have.shape) == tuple(want.shape), (name, have.shape, want.shape)
        assert torch.equal(bits(have), bits(want)), name
    print("compare: %d tensors equal bit for bit in %s" % (len(original), path))


if __name__ == "__main__":
    main()
