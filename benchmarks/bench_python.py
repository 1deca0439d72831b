#!/usr/bin/env python3
"""shardckpt from Python against PyTorch Distributed Checkpoint (torch 2.x), in one run, on the
same state, ranks and folder:

  PY=$(bash launch/torch2_venv.sh)
  $PY benchmarks/bench_python.py --dir /work/bench-py --size 1GiB --save-ranks 2 --load-ranks 3

The state: T float32 tensors [rows, 4096] (--size in all) as DTensors Shard(0) over the ranks
(FSDP2's layout), values (flat index + 7919 * tensor) % 65521, every load checked. Measured, each
the median of --iters (between barriers, the slowest rank):
  save                  shardckpt.save           vs dcp.save                      (N ranks)
  load                  shardckpt.load           vs dcp.load                      (N ranks)
  resharded load        shardckpt.load           vs dcp.load                      (saved by N, loaded by M)
  async save, blocking  shardckpt.async_save     vs dcp.async_save, and a memcpy of the same bytes
  async save, total     ... until the handle's wait() / the future's result() returns
  Python overhead       shardckpt.save/load      vs the time inside the extension, and vs the
                        C++ API on the same bytes (build/bin/bench_dcp_peer, when built)
DCP's async staging: its pinned-memory options (StagingOptions, and FileSystemWriter's
cache_staged_state_dict=True, which keeps and reuses a pinned staging copy as shardckpt keeps its
own) need CUDA: where CUDA is present both DCP variants are measured, on CPU only the default (a
fresh copy each call). The first call of each (allocation) is reported apart from the steady
state. Before every load the page cache of
both checkpoints is emptied (posix_fadvise DONTNEED after fsync: no root needed), since DCP reads
through it and shardckpt with O_DIRECT does not. Workers run under launch/mpirun.sh (shardckpt on
MPI_COMM_WORLD, DCP on gloo, as with torchrun). The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = 4096


def parse_size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    upper = text.strip().upper()
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * factor)
    return int(upper)


# ---- Worker (one process per rank) -----------------------------------------------------------

def evict(folder: str) -> None:
    """Drops a folder's files from the page cache (written and fsynced, so clean pages)."""
    for base, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Worker:
    def __init__(self, args) -> None:
        sys.path.insert(0, os.path.join(ROOT, "launch"))
        from train_fsdp2 import init_distributed  # rank and size from mpirun's variables
        import torch
        import torch.distributed as dist
        init_distributed()
        import shardckpt
        from torch.distributed.device_mesh import init_device_mesh
        self.torch, self.dist, self.shardckpt, self.args = torch, dist, shardckpt, args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.mesh = init_device_mesh("cpu", (self.world,))
        self.rows = args.rows
        per = -(-self.rows // self.world)
        self.lo, self.hi = min(self.rank * per, self.rows), min((self.rank + 1) * per, self.rows)
        self.comm = shardckpt.world()
        self.inside = []  # seconds spent in the extension's save/load calls
        self._time_extension()

    def _time_extension(self) -> None:
        """Wraps the extension's save and load so the Python layer's own time can be told apart."""
        core = sys.modules["shardckpt._core"] if "shardckpt._core" in sys.modules else None
        if core is None:
            from shardckpt import _core as core
        for name in ("save", "load"):
            inner = getattr(core, name)

            def timed(*a, _inner=inner, **k):
                start = time.perf_counter()
                try:
                    return _inner(*a, **k)
                finally:
                    self.inside.append(time.perf_counter() - start)
            setattr(core, name, timed)

    def block(self, t: int):
        torch = self.torch
        index = torch.arange(self.lo * COLS, self.hi * COLS, dtype=torch.int64)
        return ((index + 7919 * t) % 65521).to(torch.float32).reshape(self.hi - self.lo, COLS)

    def state(self, fill: bool) -> dict:
        from torch.distributed.tensor import DTensor, Shard
        torch = self.torch
        out = {}
        for t in range(self.args.tensors):
            local = self.block(t) if fill else torch.zeros(self.hi - self.lo, COLS)
            out["layers.%d.weight" % t] = DTensor.from_local(
                local, self.mesh, [Shard(0)], run_check=False,
                shape=torch.Size([self.rows, COLS]), stride=(COLS, 1))
        return out

    def check(self, state: dict, what: str) -> None:
        for t in range(self.args.tensors):
            if not self.torch.equal(state["layers.%d.weight" % t].to_local(), self.block(t)):
                raise SystemExit("bench_python: rank %d: %s loaded tensor %d wrong" % (self.rank, what, t))
        for value in state.values():
            value.to_local().zero_()

    def barrier(self) -> None:
        self.dist.barrier()

    def slowest(self, seconds: float) -> float:
        t = self.torch.tensor([seconds], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def timed(self, fn) -> float:
        """Wall time of a collective step, between barriers."""
        self.barrier()
        start = time.perf_counter()
        fn()
        self.barrier()
        return time.perf_counter() - start

    def clear(self, *folders: str) -> None:
        if self.rank == 0:
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
        self.barrier()

    def evict(self, *folders: str) -> None:
        if self.rank == 0:
            for folder in folders:
                evict(folder)
        self.barrier()

    def overhead(self, fn) -> tuple:
        """(wall seconds, slowest rank's seconds outside the extension) of one call."""
        self.inside.clear()
        self.barrier()
        start = time.perf_counter()
        fn()
        mine = time.perf_counter() - start
        self.barrier()
        wall = time.perf_counter() - start
        return wall, self.slowest(mine - sum(self.inside))

    def save_phase(self) -> dict:
        import torch.distributed.checkpoint as dcp
        a, sck = self.args, self.shardckpt
        ours_dir, dcp_dir = os.path.join(a.dir, "shardckpt"), os.path.join(a.dir, "dcp")
        state = self.state(True)
        res = {k: [] for k in ("save_ours", "save_ours_outside", "save_dcp", "load_ours",
                               "load_ours_outside", "load_dcp")}
        for i in range(a.iters):
            for who in (("ours", "dcp") if i % 2 == 0 else ("dcp", "ours")):
                if who == "ours":
                    self.clear(ours_dir)
                    wall, outside = self.overhead(lambda: sck.save(state, ours_dir, step=1))
                    res["save_ours"].append(wall)
                    res["save_ours_outside"].append(outside)
                else:
                    self.clear(dcp_dir)
                    res["save_dcp"].append(self.timed(lambda: dcp.save(state, checkpoint_id=dcp_dir)))
        into = self.state(False)
        for i in range(a.iters):
            for who in (("ours", "dcp") if i % 2 == 0 else ("dcp", "ours")):
                self.evict(ours_dir, dcp_dir)
                if who == "ours":
                    wall, outside = self.overhead(lambda: sck.load(into, ours_dir))
                    res["load_ours"].append(wall)
                    res["load_ours_outside"].append(outside)
                else:
                    res["load_dcp"].append(self.timed(lambda: dcp.load(into, checkpoint_id=dcp_dir)))
                self.check(into, who)
        del into
        res.update(self.async_phase(state))
        return res

    def async_phase(self, state: dict) -> dict:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter
        a, sck, torch = self.args, self.shardckpt, self.torch
        folders = {"ours": os.path.join(a.dir, "async-shardckpt"),
                   "dcp": os.path.join(a.dir, "async-dcp"),
                   "dcp_cached": os.path.join(a.dir, "async-dcp-cached")}
        if not torch.cuda.is_available():  # DCP pins its cached staging: CUDA only
            del folders["dcp_cached"]
        else:
            writer = FileSystemWriter(folders["dcp_cached"], cache_staged_state_dict=True)
        # DCP's upload thread runs collectives: on a group of its own (as DCP advises), since this
        # thread's barriers on the default group would otherwise interleave with them (a hang).
        group = self.dist.new_group(backend="gloo")
        out = {}

        def start(who: str, step: int):
            if who == "ours":
                return sck.async_save(state, folders["ours"], step=step)
            if who == "dcp":
                return dcp.async_save(state, checkpoint_id=folders["dcp"], process_group=group)
            return dcp.async_save(state, checkpoint_id=folders["dcp_cached"], storage_writer=writer,
                                  process_group=group)

        def finish(who: str, pending) -> None:
            if who == "ours":
                pending.wait()
            else:
                (pending.upload_completion if hasattr(pending, "upload_completion") else pending).result()

        for i in range(a.iters + 1):  # call 0 allocates the staging: reported apart
            for who in folders:
                self.clear(folders[who])
                self.barrier()
                begin = time.perf_counter()
                pending = start(who, i + 1)
                blocking = self.slowest(time.perf_counter() - begin)
                finish(who, pending)
                self.barrier()
                total = time.perf_counter() - begin
                out.setdefault("async_%s_blocking" % who, []).append(blocking)
                out.setdefault("async_%s_total" % who, []).append(total)
        # A memcpy of the same bytes: into buffers kept across calls (the steady state), and into
        # fresh ones (what a first call pays).
        locals_ = [v.to_local() for v in state.values()]
        kept = [torch.empty_like(t) for t in locals_]
        for i in range(a.iters + 1):
            self.barrier()
            begin = time.perf_counter()
            fresh = [torch.empty_like(t).copy_(t) for t in locals_] if i == 0 else None
            if i:
                for dst, src in zip(kept, locals_):
                    dst.copy_(src)
            out.setdefault("memcpy", []).append(self.slowest(time.perf_counter() - begin))
            del fresh
        return out

    def reshard_phase(self) -> dict:
        import torch.distributed.checkpoint as dcp
        a, sck = self.args, self.shardckpt
        ours_dir, dcp_dir = os.path.join(a.dir, "shardckpt"), os.path.join(a.dir, "dcp")
        into = self.state(False)
        res = {"reshard_ours": [], "reshard_dcp": []}
        for i in range(a.iters):
            for who in (("ours", "dcp") if i % 2 == 0 else ("dcp", "ours")):
                self.evict(ours_dir, dcp_dir)
                if who == "ours":
                    res["reshard_ours"].append(self.timed(lambda: sck.load(into, ours_dir)))
                else:
                    res["reshard_dcp"].append(self.timed(lambda: dcp.load(into, checkpoint_id=dcp_dir)))
                self.check(into, "resharded " + who)
        return res


def worker_main(args) -> None:
    w = Worker(args)
    res = w.save_phase() if args.worker == "save" else w.reshard_phase()
    if w.rank == 0:
        print(json.dumps(res), flush=True)
    w.dist.destroy_process_group()


# ---- Driver ---------------------------------------------------------------------------------

def launch(np: int, argv: list) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.join(ROOT, "build", "python"),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["MASTER_PORT"] = str(s.getsockname()[1])
    cmd = ["bash", os.path.join(ROOT, "launch", "mpirun.sh"), "-np", str(np), "-x", "MASTER_ADDR",
           "-x", "MASTER_PORT", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"] + argv
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s\n%s" % (" ".join(cmd), out.stdout[-4000:], out.stderr[-4000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpp_reference(args, np: int) -> dict:
    """The C++ API on the same bytes and folder (build/bin/bench_dcp_peer: same tensors, chunks,
    fsync and commit), median of --iters; None when it is not built."""
    exe = os.path.join(ROOT, "build", "bin", "bench_dcp_peer")
    if not os.path.exists(exe):
        return {}
    folder = os.path.join(args.dir, "cpp")
    res = {"save_cpp": [], "load_cpp": []}
    for _ in range(args.iters):
        shutil.rmtree(folder, ignore_errors=True)
        common = ["--dir", folder, "--rows", str(args.rows), "--tensors", str(args.tensors)]
        res["save_cpp"].append(launch(np, [exe, "--mode", "save"] + common)["seconds"])
        evict(folder)
        res["load_cpp"].append(launch(np, [exe, "--mode", "load"] + common)["seconds"])
    shutil.rmtree(folder, ignore_errors=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/tmp/shardckpt-bench-python", help="folder for every checkpoint")
    p.add_argument("--size", default="256MiB", help="state size over all ranks (1GiB for the record)")
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--save-ranks", type=int, default=2)
    p.add_argument("--load-ranks", type=int, default=3, help="ranks of the resharded load")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--worker", choices=["save", "reshard"], help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    size = parse_size(args.size)
    if args.rows is None:
        args.rows = max(1, size // (args.tensors * COLS * 4))
    if args.worker:
        worker_main(args)
        return
    import torch
    nbytes = args.rows * COLS * 4 * args.tensors
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    me = [sys.executable, os.path.abspath(__file__), "--dir", args.dir, "--rows", str(args.rows),
          "--tensors", str(args.tensors), "--iters", str(args.iters)]
    print("bench_python: %.2f GiB in %d tensors [%d, %d] float32, torch %s, %s, saved by %d, "
          "resharded to %d, median of %d" % (nbytes / 2**30, args.tensors, args.rows, COLS,
                                              torch.__version__, args.dir, args.save_ranks,
                                              args.load_ranks, args.iters), flush=True)
    raw = launch(args.save_ranks, me + ["--worker", "save"])
    raw.update(launch(args.load_ranks, me + ["--worker", "reshard"]))
    raw.update(cpp_reference(args, args.save_ranks))
    shutil.rmtree(args.dir, ignore_errors=True)

    med = {k: statistics.median(v[1:] if k.startswith(("async", "memcpy")) else v)
           for k, v in raw.items()}
    first = {k: v[0] for k, v in raw.items() if k.startswith(("async", "memcpy"))}
    gib = nbytes / 2**30
    rows = [("save", "save_ours", "save_dcp"), ("load", "load_ours", "load_dcp"),
            ("resharded load %d->%d" % (args.save_ranks, args.load_ranks), "reshard_ours", "reshard_dcp"),
            ("async save, total", "async_ours_total", "async_dcp_total")]
    summary = {"bytes": nbytes, "torch": torch.__version__, "dir": args.dir,
               "save_ranks": args.save_ranks, "load_ranks": args.load_ranks, "iters": args.iters}
    print("%-30s %12s %12s %10s" % ("operation", "ours GiB/s", "DCP GiB/s", "ours/DCP"))
    for label, ours, theirs in rows:
        ratio = med[theirs] / med[ours]
        print("%-30s %12.2f %12.2f %10.2f" % (label, gib / med[ours], gib / med[theirs], ratio))
        summary[ours.replace("_ours", "") + "_vs_dcp"] = round(ratio, 3)
        summary[ours + "_gib_s"] = round(gib / med[ours], 3)
        summary[theirs + "_gib_s"] = round(gib / med[theirs], 3)
    print("async blocking (ms, steady | first call): shardckpt %.1f | %.1f, DCP %.1f | %.1f, "
          "memcpy %.1f | %.1f (fresh buffers)" % tuple(
              1e3 * x for x in (med["async_ours_blocking"], first["async_ours_blocking"],
                                med["async_dcp_blocking"], first["async_dcp_blocking"],
                                med["memcpy"], first["memcpy"])))
    if "async_dcp_cached_blocking" in med:
        print("DCP with cached pinned staging: blocking %.1f | %.1f ms" % (
            1e3 * med["async_dcp_cached_blocking"], 1e3 * first["async_dcp_cached_blocking"]))
        summary["dcp_cached_async_blocking_ms"] = round(1e3 * med["async_dcp_cached_blocking"], 2)
        summary["async_blocking_vs_dcp_cached"] = round(
            med["async_ours_blocking"] / med["async_dcp_cached_blocking"], 3)
    summary.update({
        "async_blocking_ms": round(1e3 * med["async_ours_blocking"], 2),
        "async_blocking_first_ms": round(1e3 * first["async_ours_blocking"], 2),
        "dcp_async_blocking_ms": round(1e3 * med["async_dcp_blocking"], 2),
        "memcpy_ms": round(1e3 * med["memcpy"], 2),
        "async_blocking_vs_memcpy": round(med["async_ours_blocking"] / med["memcpy"], 3),
        "async_blocking_vs_dcp": round(med["async_ours_blocking"] / med["async_dcp_blocking"], 3),
    })
    print("async blocking / memcpy %.2f, / DCP %.2f" % (
        summary["async_blocking_vs_memcpy"], summary["async_blocking_vs_dcp"]))
    for op in ("save", "load"):
        outside = med["%s_ours_outside" % op] / med["%s_ours" % op]
        summary["python_outside_extension_%s" % op] = round(outside, 4)
        line = "python layer, %s: %.2f%% of the call outside the extension" % (op, 100 * outside)
        if "%s_cpp" % op in med:
            vs = med["%s_ours" % op] / med["%s_cpp" % op]
            summary["python_vs_cpp_%s" % op] = round(vs, 3)
            line += "; Python call / C++ API (bench_dcp_peer) %.3f" % vs
        print(line)
    summary["seconds"] = {k: round(v, 4) for k, v in med.items()}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
