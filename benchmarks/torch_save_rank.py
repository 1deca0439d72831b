#!/usr/bin/python3
"""One rank's torch.save baseline for bench_save_load: the tensors a user would hand to
torch.save, saved the way a user saves them (torch.save of a dict, then fsync).

  torch_save_rank.py --path FILE --seed S --shapes 8192x1024,8192x1024,...

The tensors are torch.rand(shape) after torch.manual_seed(S), in order: with the same libtorch
(Debian's 1.13, which bench_save_load links too) they equal the benchmark's at::rand ones.
Prints "ready" once they exist, then waits for a line on stdin, so that every rank starts
together and Python's start-up is not timed; then prints one JSON line: seconds for
torch.save + flush + fsync, bytes of the file, and the first tensor's sum (to check sameness).
"""
import argparse
import json
import os
import sys
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--shapes", required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    shapes = [[int(d) for d in s.split("x")] for s in args.shapes.split(",")]
    state = {f"layer.{i}.weight": torch.rand(shape) for i, shape in enumerate(shapes)}
    print("ready", flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0  # the benchmark went away
        start = time.perf_counter()
        with open(args.path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - start
        first = state["layer.0.weight"]
        print(json.dumps({"seconds": seconds, "bytes": os.path.getsize(args.path),
                          "sum0": float(first.double().sum())}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
