#!/usr/bin/env python3
"""shardckpt against PyTorch Distributed Checkpoint (torch.distributed.checkpoint), in one run,
on the same bytes, rank counts and folders:

  python3 benchmarks/bench_dcp.py --dirs /tmp/bdcp /dev/shm/bdcp --save-ranks 2 --load-ranks 3

For each folder and iteration: save at N ranks, load at N (same layout), load at M (resharded,
dim-0 blocks of N become dim-0 blocks of M), once with build/bin/bench_dcp_peer and once with
benchmarks/dcp_worker.py (DCP, gloo, CPU tensors), alternating which goes first. Both fsync on
save; page caches are dropped before every load where the kernel allows it (noted in the
output), since DCP reads through the page cache and shardckpt with O_DIRECT does not. Prints
medians, our throughput over DCP's for each operation, and a JSON last line.

The current torch comes from the project's torch 2.x virtual environment (launch/torch2_venv.sh:
created once in ~/.cache/shardckpt, pinned versions, shared with the tests; the system Python
keeps Debian's torch)."""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_venv():
    """The torch 2.x venv the tests use (created on first use); returns the torch version."""
    global PY
    made = subprocess.run(["bash", os.path.join(ROOT, "launch", "torch2_venv.sh")], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit("launch/torch2_venv.sh failed:\n" + made.stdout + made.stderr)
    PY = made.stdout.strip().splitlines()[-1]
    probe = [PY, "-c", "import torch, torch.distributed.checkpoint; print(torch.__version__)"]
    return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(np, argv):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [os.path.join(ROOT, "launch", "mpirun.sh"), "-np", str(np)] + argv
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours(np, mode, d, rows, tensors):
    return run(np, [os.path.join(ROOT, "build", "bin", "bench_dcp_peer"), "--mode", mode, "--dir", d,
                    "--rows", str(rows), "--tensors", str(tensors)])


def dcp(np, mode, d, rows, tensors):
    port = str(random.randint(20000, 40000))
    return run(np, [PY, os.path.join(ROOT, "benchmarks", "dcp_worker.py"), "--mode", mode, "--dir", d,
                    "--rows", str(rows), "--tensors", str(tensors), "--port", port])


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * m)
    return int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dirs", nargs="+", default=["/tmp/shardckpt-bench-dcp", "/dev/shm/shardckpt-bench-dcp"])
    p.add_argument("--save-ranks", type=int, default=2)
    p.add_argument("--load-ranks", type=int, default=3)
    p.add_argument("--total-bytes", default="1GiB")
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()
    torch_version = ensure_venv()
    rows = max(1, parse_size(a.total_bytes) // a.tensors // (4096 * 4))
    n, m = a.save_ranks, a.load_ranks
    print(f"torch {torch_version} ({PY}); {a.tensors} tensors [{rows}, 4096] float32 = "
          f"{rows * 4096 * 4 * a.tensors / 2**30:.2f} GiB; save at {n} ranks, load at {n} and at {m}", flush=True)
    result = {"torch": torch_version, "save_ranks": n, "load_ranks": m, "bytes": rows * 4096 * 4 * a.tensors}
    dropped_all = True
    for base in a.dirs:
        times = {(who, op): [] for who in ("ours", "dcp") for op in ("save", "load", "reshard")}
        for it in range(a.iters):
            order = [("ours", ours), ("dcp", dcp)]
            if it % 2:
                order.reverse()
            for who, fn in order:
                d = os.path.join(base, who)
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(base, exist_ok=True)
                times[(who, "save")].append(fn(n, "save", d, rows, a.tensors)["seconds"])
                dropped_all &= drop_caches()
                times[(who, "load")].append(fn(n, "load", d, rows, a.tensors)["seconds"])
                dropped_all &= drop_caches()
                times[(who, "reshard")].append(fn(m, "load", d, rows, a.tensors)["seconds"])
                shutil.rmtree(d, ignore_errors=True)
        gib = result["bytes"] / 2**30
        tag = "shm" if base.startswith("/dev/shm") else "disk"
        print(f"\n{base} ({tag}), medians of {a.iters}:")
        print(f"{'op':>22} {'shardckpt GiB/s':>16} {'DCP GiB/s':>10} {'ours/DCP':>9}")
        for op, label in (("save", f"save at {n}"), ("load", f"load at {n}"), ("reshard", f"resharded load at {m}")):
            o = gib / statistics.median(times[("ours", op)])
            c = gib / statistics.median(times[("dcp", op)])
            print(f"{label:>22} {o:16.2f} {c:10.2f} {o / c:9.2f}")
            result[f"{tag}_{op}_ours_gibps"] = round(o, 3)
            result[f"{tag}_{op}_dcp_gibps"] = round(c, 3)
            result[f"{tag}_{op}_ours_vs_dcp"] = round(o / c, 3)
    result["page_cache_dropped_before_loads"] = dropped_all
    if not dropped_all:
        print("\nnote: could not drop the page cache here; DCP's buffered loads may be served from memory")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
