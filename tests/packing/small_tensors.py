"""Many small tensors and a few large ones, as real state dicts hold them (biases, norms, step
counters, optimizer moments), for the packing tests and benchmark (docs/format.md, format 1.1).

usage: small_tensors.py make OUT.pt COUNT LARGE   writes the state dict, prints its tensor bytes
       small_tensors.py compare A.pt B.pt          every key, dtype, shape and value equal
       small_tensors.py amplification ROOT BYTES    data file bytes of ROOT's latest over BYTES
"""
import glob
import math
import os
import random
import sys
from collections import OrderedDict

import torch


def make(path, count, large):
    rng = random.Random(14)
    sd = OrderedDict()
    dtypes = [torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.int64]
    for i in range(count):
        dtype = dtypes[i % len(dtypes)]
        size = torch.tensor([], dtype=dtype).element_size()
        nbytes = int(math.exp(rng.uniform(math.log(4), math.log(16384))))  # 4 B to 16 KiB, log-uniform
        numel = max(1, nbytes // size)
        if i % 97 == 0:
            shape = ()  # a step counter
        elif i % 3 == 0 and numel >= 32:
            shape = (numel // 16, 16)  # a small matrix: dim0 cuts it into rows
        else:
            shape = (numel,)
        n = math.prod(shape)
        if dtype == torch.int64:
            t = torch.arange(n, dtype=dtype).reshape(shape) * 7 + i
        else:
            t = (torch.arange(n, dtype=torch.float32).reshape(shape) * 0.37 + i).to(dtype)
        sd["layers.%d.%s" % (i // 8, ["bias", "norm.weight", "norm.bias", "scale", "exp_avg", "exp_avg_sq", "step", "w"][i % 8])] = t
    for k in range(large):
        sd["big.%d" % k] = torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024) * (k + 1)  # 4 MiB
    torch.save(sd, path)
    print(sum(t.numel() * t.element_size() for t in sd.values()))


def compare(a_path, b_path):
    a = torch.load(a_path)
    b = torch.load(b_path)
    assert list(a.keys()) == list(b.keys()) or set(a.keys()) == set(b.keys()), "key sets differ"
    for k, t in a.items():
        u = b[k]
        assert t.dtype == u.dtype and t.shape == u.shape, "%s: %s %s vs %s %s" % (k, t.dtype, tuple(t.shape), u.dtype, tuple(u.shape))
        assert torch.equal(t, u), "%s: values differ" % k
    print("equal: %d tensors" % len(a))


def amplification(root, tensor_bytes):
    folder = os.path.join(root, open(os.path.join(root, "latest")).read().strip())
    data = sum(os.path.getsize(f) for f in glob.glob(os.path.join(folder, "rank-*.bin")))
    print("%.4f" % (data / tensor_bytes))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        amplification(sys.argv[2], int(sys.argv[3]))
