"""Checks of tests/interop/formats_case.sh, each against the file make_format_cases.py wrote.

usage: check_formats.py CHECK ARGS...
  same ORIGINAL.pt OUT.pt [--exclude NAME]...  every tensor equal bit for bit, same dtype, shape and
                                              key order; OUT loads with weights_only=True (and
                                              mmap=True where torch has it)
  lists ORIGINAL.pt OUT.pt                     the nesting restored (dicts, int keys, lists, tuples), values kept
  optim ORIGINAL.pt OUT.pt                     OUT is ORIGINAL's optimizer state dict, which Adam loads
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


def same_tree(a, b, where="the state dict"):
    """b has a's nesting: dicts (keys of the same types, in order), lists and tuples, values equal
    in type and value, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return equal(a, b, where)
    if isinstance(a, dict):
        assert isinstance(b, dict), (where, type(b))
        assert list(b.keys()) == list(a.keys()), (where, list(b.keys()), list(a.keys()))
        assert [type(k) for k in b] == [type(k) for k in a], (where, list(b.keys()))
        for k in a:
            same_tree(a[k], b[k], "%s[%r]" % (where, k))
    elif isinstance(a, (list, tuple)):
        assert type(b) is type(a) and len(b) == len(a), (where, type(b), b)
        for i, (x, y) in enumerate(zip(a, b)):
            same_tree(x, y, "%s[%d]" % (where, i))
    else:
        assert type(b) is type(a) and b == a, (where, a, b)


def lists(original, out):
    a = original_of(original)
    if torch.__version__.startswith("1."):
        # torch 1.13's weights_only reader has no BINFLOAT: it cannot read a float value in any
        # file, its own torch.save's included, so this one is read without it.
        b = torch.load(out, weights_only=False)
    else:
        b = load(out)
    # The nesting imported comes back whole: dicts (an optimizer's int keys as ints), lists and
    # tuples; values with their types (ints past 64 bits, bytes).
    same_tree(a, b)
    assert list(b["model"]) == ["layers.0.weight"] and list(b["optim"]["state"]) == [0, 1], b
    assert all(type(v) is int for v in b["flags"][3:]), b["flags"]
    print("lists: nesting and values restored in", out)


def optim(original, out):
    """OUT is the original's optimizer state dict alone (consolidated with --strip-prefix optim.),
    which torch.optim loads: int keys and param groups as saved."""
    a = original_of(original)["optim"]
    b = torch.load(out, weights_only=False) if torch.__version__.startswith("1.") else load(out)
    same_tree(a, b)
    params = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    opt = torch.optim.Adam(params, lr=0.1)
    opt.load_state_dict(b)
    assert opt.param_groups[0]["lr"] == 0.5, opt.param_groups
    equal(a["state"][1]["exp_avg"], opt.state[params[1]]["exp_avg"], "state[1].exp_avg")
    print("optim: torch.optim.Adam loads", out)


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
    elif check == "optim":
        optim(*args)
    elif check == "tied":
        tied(*args)
    elif check == "safetensors":
        safetensors_check(args[0], args[1], args[2:])
    elif check == "hf":
        hf(*args)
    else:
        sys.exit("unknown check " + check)
