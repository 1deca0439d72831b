"""Writes state dicts with real PyTorch (Debian's python3-torch) for the interop tests.

usage: make_state_dict.py OUT.pt [hostile-os-system|hostile-eval]
The normal dict holds every dtype torch 1.13 has, 0-d and empty tensors, views that share one
storage (including a transposed, non-contiguous one), a nested dict, and a non-tensor value.
"""
import collections
import os
import sys

import torch


def state_dict():
    g = torch.Generator().manual_seed(7)
    sd = collections.OrderedDict()
    sd["f64"] = torch.randn(3, 5, generator=g, dtype=torch.float64)
    sd["f32"] = torch.randn(37, 19, generator=g)
    sd["f16"] = torch.randn(6, 13, generator=g).half()
    sd["bf16"] = torch.randn(10, 7, generator=g).bfloat16()
    sd["i64"] = torch.randint(-2**40, 2**40, (5, 3), generator=g)
    sd["i32"] = torch.randint(-2**30, 2**30, (17,), generator=g, dtype=torch.int32)
    sd["i16"] = torch.randint(-2**14, 2**14, (4, 4, 4), generator=g, dtype=torch.int16)
    sd["i8"] = torch.randint(-128, 127, (33,), generator=g, dtype=torch.int8)
    sd["u8"] = torch.randint(0, 255, (300, 20), generator=g, dtype=torch.uint8)
    sd["mask"] = torch.rand(17, generator=g) > 0.5
    sd["scalar"] = torch.tensor(3.25)
    sd["empty"] = torch.zeros(0, 4)
    base = torch.arange(48, dtype=torch.float32).view(6, 8)
    sd["shared.rows"] = base[2:5]            # a view into base's storage, with an offset
    sd["shared.t"] = base.t()                # non-contiguous view of the same storage
    sd["shared.base"] = base
    sd["nested"] = {"inner": {"w": torch.randn(4, 4, generator=g)}}
    sd["not_a_tensor"] = 42
    return sd


class Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


if __name__ == "__main__":
    out = sys.argv[1]
    kind = sys.argv[2] if len(sys.argv) > 2 else "normal"
    if kind == "normal":
        torch.save(state_dict(), out)
    elif kind == "hostile-os-system":
        torch.save({"w": torch.ones(2), "x": Evil(os.system, "touch " + out + ".pwned")}, out)
    elif kind == "hostile-eval":
        import builtins
        torch.save({"w": torch.ones(2), "x": Evil(builtins.eval, "__import__('os').system('touch " + out + ".pwned')")}, out)
