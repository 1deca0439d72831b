"""Checks of tests/interop/formats_case.sh, each against the file make_format_cases.py wrote.

usage: check_formats.py CHECK ARGS...
  same ORIGINAL.pt OUT.pt [--exclude NAME]...  every tensor equal bit for bit, same dtype, shape and
                                              key order; OUT loads with weights_only=True (and
                                              mmap=True where torch has it)
  lists ORIGINAL.pt OUT.pt                     lists and tuples restored, values kept
  tied OUT.pt                                  the tied names share one storage
  safetensors ORIGINAL.pt OUT.safetensors NAME...  those tensors, read by the safetensors package
  hf HF_DIR OUT_DIR                            from_pretrained of OUT_DIR equals HF_DIR's model
"""
import sys

import torch


def load(path):
    try:
        return torch.load(path, weights_only=True, mmap=True)
    except TypeError:  # torch 1.13 has no mmap
        return torch.load(path, weights_only=True)


def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t


def equal(a, b, where):
    assert isinstance(b, torch.Tensor), (where, type(b))
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (where, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(bits(a), bits(b)), where


def original_of(path):
    # Written by make_format_cases.py (trusted); torch's own weights_only reader refuses protocol 4.
    return torch.load(path, weights_only=False)


def same(original, out, exclude):
    a = original_of(original)
    b = load(out)
    keys = [k for k in a if k not in exclude]
    assert list(b.keys()) == keys, (list(b.keys()), keys)
    for k in keys:
        equal(a[k], b[k], k)
    print("same: %d tensors equal, in order, in %s" % (len(keys), out))


def lists(original, out):
    a = original_of(original)
    if torch.__version__.startswith("1."):
        # torch 1.13's weights_only reader has no BINFLOAT: it cannot read a float value in any
        # file, its own torch.save's included, so this one is read without it.
        b = torch.load(out, weights_only=False)
    else:
        b = load(out)
    # Dict nesting at the top comes back as dotted keys, lists and tuples as lists and tuples.
    assert list(b.keys()) == ["w", "lst", "opt.steps", "opt.lr", "tup", "epoch", "name", "nothing", "flags", "raw"], list(b)
    assert isinstance(b["lst"], list) and len(b["lst"]) == 2, b["lst"]
    equal(a["lst"][0], b["lst"][0], "lst.0")
    equal(a["lst"][1], b["lst"][1], "lst.1")
    assert isinstance(b["opt.steps"], list) and isinstance(b["opt.steps"][1], dict), b["opt.steps"]
    equal(a["opt"]["steps"][0], b["opt.steps"][0], "opt.steps.0")
    equal(a["opt"]["steps"][1]["m"], b["opt.steps"][1]["m"], "opt.steps.1.m")
    assert isinstance(b["tup"], tuple) and len(b["tup"]) == 2, b["tup"]
    equal(a["tup"][0], b["tup"][0], "tup.0")
    assert b["opt.lr"] == 0.125 and b["epoch"] == 42 and b["name"] == "run-7" and b["nothing"] is None, b
    assert b["flags"] == [1, 2, "x", 2 ** 70, -2 ** 65], b["flags"]
    assert all(type(v) is int for v in b["flags"][3:]), b["flags"]
    assert b["raw"] == [b"\x00\xffab\x80", b""] and all(type(v) is bytes for v in b["raw"]), b["raw"]
    print("lists: nesting and values restored in", out)


def tied(out):
    b = load(out)
    assert list(b) == ["model.embed.weight", "model.norm.weight", "lm_head.weight", "a.bias"], list(b)
    ptr = lambda t: t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()
    assert ptr(b["model.embed.weight"]) == ptr(b["lm_head.weight"]), "tied weights are two storages"
    assert ptr(b["model.embed.weight"]) != ptr(b["a.bias"])
    print("tied: one storage under two names in", out)


def safetensors_check(original, out, names):
    import safetensors.torch
    a = original_of(original)
    b = safetensors.torch.load_file(out)
    for k in names:
        equal(a[k], b[k], k)
    print("safetensors: %d tensors equal in %s" % (len(names), out))


def hf(src, out):
    import transformers
    a = transformers.LlamaForCausalLM.from_pretrained(src)
    b = transformers.LlamaForCausalLM.from_pretrained(out)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        equal(sa[k], sb[k], k)
    ids = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(a(ids).logits, b(ids).logits)
    print("hf: from_pretrained gives equal weights and logits from", out)


if __name__ == "__main__":
    check, args = sys.argv[1], sys.argv[2:]
    if check == "same":
        exclude = [args[i + 1] for i in range(2, len(args), 2) if args[i] == "--exclude"]
        same(args[0], args[1], exclude)
    elif check == "lists":
        lists(*args)
    elif check == "tied":
        tied(*args)
    elif check == "safetensors":
        safetensors_check(args[0], args[1], args[2:])
    elif check == "hf":
        hf(*args)
    else:
        sys.exit("unknown check " + check)
