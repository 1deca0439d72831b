"""shardckpt reading a DCP folder against torch's own readers (issue 13 part 6, the DCP half).

    PY2=$(bash launch/torch2_venv.sh --find)
    $PY2 benchmarks/bench_dcp_read.py --dir /dev/shm/dcpbench --gib 2 --cli build/bin/shardckpt \
        --module build/python

1. `dcp.save` of a model of --gib GiB (float32 [4099, 8192] tensors, Shard(0) DTensors) from 2
   processes (torchrun, gloo) into --dir/dcp.
2. consolidation to one .pt: `shardckpt consolidate` against torch's `dcp_to_torch_save`, each a
   fresh process under /usr/bin/time -v (wall time, peak RSS); both outputs compared with
   torch.load(mmap=True).
3. a resharded load 2 -> 3: three processes each loading its Shard(0) rows of every tensor,
   shardckpt (Python package under mpirun, FlatShard targets) against `dcp.load` into DTensors on
   a 3-rank mesh (torchrun, gloo); wall time is the slowest rank's load call, values checked.
   Read amplification: bytes read over bytes wanted, summed over ranks; for dcp.load it is
   computed from its reader, which reads every chunk that overlaps a rank's rows whole.
Last line: one JSON object.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "tests", "python", "dcp_read_gen.py")


def timed(cmd, env=None):
    run = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit("failed: %s\n%s\n%s" % (" ".join(cmd), run.stdout[-2000:], run.stderr[-3000:]))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1)) * 1024
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", run.stderr)
    wall = int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    return wall, rss, run.stdout


def torchrun(n, args):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master_addr", "127.0.0.1",
            "--master_port", str(port), "--nproc_per_node", str(n), *args]


def rows_of(rank, world, rows):
    per = (rows + world - 1) // world  # torch.chunk, as Shard(0) splits
    begin = min(rows, rank * per)
    return begin, min(rows, begin + per)


def worker_shardckpt_load(folder):
    import torch
    import shardckpt
    comm = shardckpt.world()
    meta = shardckpt.inspect(folder)
    target, locals_ = {}, {}
    for e in meta["entries"]:
        rows, cols = e["shape"]
        b, f = rows_of(comm.rank, comm.size, rows)
        local = torch.empty((f - b) * cols, dtype=torch.float32)
        target[e["name"]] = shardckpt.FlatShard(local, [rows, cols], b * cols)
        locals_[e["name"]] = (local, b)
    comm.agree("OK", "")
    t0 = time.perf_counter()
    report = shardckpt.load(target, folder)
    wall = time.perf_counter() - t0
    for name, (local, b) in locals_.items():  # row r of layer i holds i+1 (+0.5 from rank 1's save)
        i = int(name[len("layer"):].split(".")[0])
        first = float(i + 1) + (0.5 if b >= 2050 else 0.0)
        assert local.numel() == 0 or float(local[0]) == first, (name, float(local[0]), first)
    print(json.dumps({"rank": comm.rank, "wall_s": wall, "read": report.bytes_read, "wanted": report.bytes_wanted}))


def worker_dcp_load(folder):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, DTensor
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    meta = dcp.FileSystemReader(folder).read_metadata()
    sd = {}
    wanted = 0
    for name, md in meta.state_dict_metadata.items():
        rows, cols = md.size
        b, f = rows_of(rank, world, rows)
        sd[name] = DTensor.from_local(torch.empty(f - b, cols), mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size([rows, cols]), stride=(cols, 1))
        wanted += (f - b) * cols * 4
    # What its reader reads: every chunk overlapping this rank's rows, whole.
    read = 0
    for idx, info in meta.storage_data.items():
        rows = meta.state_dict_metadata[idx.fqn].size[0]
        b, f = rows_of(rank, world, rows)
        chunk = next(c for c in meta.state_dict_metadata[idx.fqn].chunks if list(c.offsets) == list(idx.offset))
        if chunk.offsets[0] < f and chunk.offsets[0] + chunk.sizes[0] > b:
            read += info.length
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(sd, checkpoint_id=folder)
    wall = time.perf_counter() - t0
    for name, t in sd.items():
        i = int(name[len("layer"):].split(".")[0])
        b, f = rows_of(rank, world, t.shape[0])
        loc = t.to_local()
        assert loc.numel() == 0 or float(loc[0, 0]) == float(i + 1) + (0.5 if b >= 2050 else 0.0), name
    print(json.dumps({"rank": rank, "wall_s": wall, "read": read, "wanted": wanted}))
    dist.destroy_process_group()


def ranks_json(stdout):
    # torchrun interleaves its workers' lines: pick the objects out wherever they are.
    out = [json.loads(m) for m in re.findall(r'\{"rank": [^{}]*\}', stdout)]
    assert len(out) == 3, stdout
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/dev/shm/dcpbench")
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--cli", default="build/bin/shardckpt")
    p.add_argument("--module", default="build/python")
    p.add_argument("--worker", choices=["sc", "dcp"])
    p.add_argument("--folder")
    a = p.parse_args()
    if a.worker == "sc":
        return worker_shardckpt_load(a.folder)
    if a.worker == "dcp":
        return worker_dcp_load(a.folder)
    import torch
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    folder = os.path.join(a.dir, "dcp")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(torchrun(2, [GEN, "big", folder, str(a.gib)]), check=True, env=env, capture_output=True)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print("DCP folder: %.2f GiB in %s" % (size / 2**30, folder))

    ours = os.path.join(a.dir, "ours.pt")
    sc_wall, sc_rss, _ = timed([os.path.abspath(a.cli), "consolidate", folder, "--out", ours])
    theirs = os.path.join(a.dir, "theirs.pt")
    code = ("from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; "
            "dcp_to_torch_save(%r, %r)" % (folder, theirs))
    t_wall, t_rss, _ = timed([sys.executable, "-c", code])
    x = torch.load(ours, mmap=True, weights_only=True)
    y = torch.load(theirs, mmap=True, weights_only=True)
    assert sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)
    del x, y
    os.remove(theirs)
    os.remove(ours)
    print("consolidate: shardckpt %.2f s, %.0f MiB peak RSS; dcp_to_torch_save %.2f s, %.0f MiB" %
          (sc_wall, sc_rss / 2**20, t_wall, t_rss / 2**20))

    envp = dict(env, PYTHONPATH=os.path.abspath(a.module))
    sc = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader,tcp", "-np", "3",
                         "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", sys.executable, __file__, "--worker", "sc",
                         "--folder", folder], capture_output=True, text=True, env=envp)
    assert sc.returncode == 0, sc.stdout[-3000:] + sc.stderr[-3000:]
    dl = subprocess.run(torchrun(3, [__file__, "--worker", "dcp", "--folder", folder]), capture_output=True, text=True,
                        env=env)
    assert dl.returncode == 0, dl.stdout[-3000:] + dl.stderr[-3000:]
    scr, dlr = ranks_json(sc.stdout), ranks_json(dl.stdout)
    sc_load = max(r["wall_s"] for r in scr)
    dl_load = max(r["wall_s"] for r in dlr)
    sc_amp = sum(r["read"] for r in scr) / sum(r["wanted"] for r in scr)
    dl_amp = sum(r["read"] for r in dlr) / sum(r["wanted"] for r in dlr)
    print("load 2 -> 3: shardckpt %.2f s (read amplification %.3f); dcp.load %.2f s (%.3f)" %
          (sc_load, sc_amp, dl_load, dl_amp))
    shutil.rmtree(a.dir, ignore_errors=True)
    print(json.dumps({"dcp_bytes": size, "dir": a.dir,
                      "consolidate": {"shardckpt_s": sc_wall, "shardckpt_rss": sc_rss, "dcp_to_torch_save_s": t_wall,
                                      "dcp_to_torch_save_rss": t_rss, "speedup": t_wall / sc_wall},
                      "load_2_to_3": {"shardckpt_s": sc_load, "dcp_load_s": dl_load, "speedup": dl_load / sc_load,
                                      "shardckpt_read_amplification": sc_amp, "dcp_read_amplification": dl_amp}}))


if __name__ == "__main__":
    main()
