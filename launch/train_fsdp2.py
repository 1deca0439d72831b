#!/usr/bin/env python3
"""The Python main job: a small transformer trained with FSDP2 (``fully_shard``), checkpointed
with ``shardckpt.async_save`` and resumed with ``shardckpt.load`` at any world size.

    torchrun --nproc_per_node 4 launch/train_fsdp2.py --ckpt /tmp/run --steps 20
    torchrun --nproc_per_node 2 launch/train_fsdp2.py --ckpt /tmp/run --steps 30 --resume
    launch/train_fsdp2.sh -np 2 --ckpt /tmp/run --steps 30 --resume      # under mpirun

Every rank prints nothing; rank 0 prints ``step N loss X`` (X is the float's repr, so two runs
can be compared exactly). On CPU the model trains over gloo; where CUDA is present, over NCCL on
the local GPU.

Resume is exact at the same world size: the model and AdamW state (from
``torch.distributed.checkpoint.state_dict.get_state_dict``), the LR schedule, every rank's RNG
states and the position in the data stream are in the checkpoint, so steps after a resume print
the losses an uninterrupted run prints. At another world size the shards are redistributed by
the load and the global batch is the same samples (each rank takes its equal slice), so the
losses differ only by the order of floating-point reductions.

SIGTERM or SIGUSR1 (torchrun, Slurm, ``launch/mpirun.sh``) stops every rank after the same step
(``shardckpt.PreemptionWatcher``), which is checkpointed before the job exits 0.
"""
from __future__ import annotations

import argparse
import atexit
import math
import os
import random
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# Launcher variables for rank and size when not started by torchrun (as launch/rank_env.sh):
# OpenMPI's mpirun, PMIx/PMI (srun --mpi=pmix, MPICH's hydra), then Slurm's own.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def _first(names, default):
    for name in names:
        if name in os.environ:
            return os.environ[name]
    return default


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def init_distributed() -> torch.device:
    """torch.distributed from torchrun's variables, or from an MPI launcher's (then MASTER_ADDR
    and MASTER_PORT must be exported to every rank, as launch/train_fsdp2.sh does), or one
    process alone. Returns the device the model lives on."""
    env = os.environ
    if "RANK" not in env:
        env["RANK"] = _first(_RANK_VARS, "0")
        env["WORLD_SIZE"] = _first(_SIZE_VARS, "1")
        env["LOCAL_RANK"] = _first(_LOCAL_VARS, "0")
        if int(env["WORLD_SIZE"]) > 1 and "MASTER_PORT" not in env:
            sys.exit("train_fsdp2: rank %s of %s has no MASTER_ADDR/MASTER_PORT: launch with "
                     "torchrun or launch/train_fsdp2.sh" % (env["RANK"], env["WORLD_SIZE"]))
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", _free_port())
    if torch.cuda.is_available():
        device = torch.device("cuda", int(env["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


# ---- The model ------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# ---- Data -----------------------------------------------------------------------------------

def sample(seed: int, index: int, vocab: int, seq: int) -> torch.Tensor:
    """Sample ``index`` of an endless synthetic stream, the same whoever asks for it: a sequence
    x[t+1] = (a * x[t] + c) mod vocab whose a, c and x[0] come from the sample's own seed, so the
    model has something to learn (in context) and any rank can produce any sample."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    a, c, x0 = (int(v) for v in torch.randint(1, vocab, (3,), generator=g))
    out = [x0]
    for _ in range(seq):
        out.append((a * out[-1] + c) % vocab)
    return torch.tensor(out)


def local_batch(args, position: int, rank: int, world: int) -> torch.Tensor:
    """This rank's equal slice of the global batch that starts at sample ``position``: the
    global batch (and so the loss) does not depend on the world size."""
    per_rank = args.global_batch // world
    first = position + rank * per_rank
    return torch.stack([sample(args.seed, i, args.vocab, args.seq) for i in range(first, first + per_rank)])


# ---- Checkpoint state -----------------------------------------------------------------------

def refused_on_rank0(ckpt: str, why: str, device, rank: int) -> bool:
    """Whether rank 0 found ``--ckpt`` unusable (``why``, "" on the other ranks): every rank
    learns it, rank 0 says why, and the process group is closed for the caller to return."""
    verdict = torch.tensor([1 if why else 0], device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
    if not int(verdict.item()):
        return False
    if rank == 0:
        print("error: cannot save into --ckpt %s: %s" % (ckpt, why), file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return True


def checkpoint_state(model, optim, sched, position: int, step: int) -> dict:
    """What a checkpoint holds. The model's and optimizer's tensors are FSDP2's DTensor shards
    (get_state_dict keys the optimizer state by parameter name, so it loads at any world size);
    RNG states are per rank; the rest are plain values."""
    import shardckpt
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optim)
    rng = {"torch": shardckpt.PerRank(torch.get_rng_state()),
           "python": shardckpt.PerRank(random.getstate())}
    if torch.cuda.is_available():
        rng["cuda"] = shardckpt.PerRank(torch.cuda.get_rng_state())
    return {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict(),
            "data": {"position": position}, "step": step, "rng": rng}


def newest_step(root: str, device: torch.device) -> int:
    """The step of the newest committed checkpoint in root (-1 for none), as every rank agrees
    (collective): a rank with a stale view of a network filesystem must not start training while
    the others load. A first run with --resume (a requeued job's first attempt) starts fresh,
    as the C++ trainer does."""
    import shardckpt
    try:
        found = int(shardckpt.inspect(root)["step"])
    except shardckpt.NotFound:
        found = -1
    agreed = torch.tensor([found], device=device)  # NCCL reduces device tensors only
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return int(agreed.item())


def finish(handle, rank: int) -> bool:
    """Waits for a save in flight and says how it ended, on every rank alike: False, with the
    error printed, when it failed. Each save's handle is waited for, not only the last one: a
    failed checkpoint would otherwise go unnoticed while training went on."""
    import shardckpt
    try:
        handle.wait()
    except shardckpt.ShardckptError as error:
        print("rank %d: checkpoint of step %d failed: %s: %s" % (rank, handle.step, type(error).__name__, error), file=sys.stderr, flush=True)
        return False
    if rank == 0:
        print("checkpoint step %d committed" % handle.step, flush=True)
    return True


def resume(args, model, optim, sched, rank: int) -> tuple:
    """Loads --resume-from, or the newest checkpoint under --ckpt, into the job (collective);
    returns (step, data position)."""
    import shardckpt
    from torch.distributed.checkpoint.state_dict import set_state_dict
    state = checkpoint_state(model, optim, sched, 0, 0)  # initializes AdamW's state to load into
    # With --resume, a --ckpt holding a checkpoint wins over --resume-from: a requeued job goes
    # on from its own newest step, not from where its first attempt started.
    own = args.resume and newest_step(args.ckpt, next(model.parameters()).device) >= 0
    if own and args.resume_from and rank == 0:
        print("--ckpt %s holds a checkpoint: resuming from it (--resume), not from --resume-from %s"
              % (args.ckpt, args.resume_from), flush=True)
    report = shardckpt.load(state, args.ckpt if own else (args.resume_from or args.ckpt))  # into the DTensor shards
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    sched.load_state_dict(state["sched"])
    rng = state["rng"]
    # At another world size the per-rank RNG states come back unavailable (they have no meaning
    # there): each rank goes on with its fresh seed. The loss depends on no random draw.
    if not report.unavailable:
        torch.set_rng_state(rng["torch"].value)
        random.setstate(rng["python"].value)  # a tuple again: blobs keep their types
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"].value)
    if rank == 0:
        print("resumed %s at step %d (saved by %d ranks, now %d)%s" % (
            report.path, state["step"], report.saved_world_size, dist.get_world_size(),
            "; per-rank values not restored: " + ", ".join(sorted(report.unavailable))
            if report.unavailable else ""), flush=True)
    return int(state["step"]), int(state["data"]["position"])


def summarize(args, world: int, step_seconds: list, save_waits: list) -> None:
    """Rank 0's account of what saving cost the loop, per save: building the state dict
    (get_state_dict), the async_save call, and the fence before the next optimizer step; against
    the median step (saving steps included). The means leave out the first save, which also
    creates the saver (a gloo group, the staging area), and the last, which has no step left to
    copy under (its fence waits for the whole copy)."""
    import json
    import statistics
    later = save_waits[1:-1] or save_waits
    mean = lambda i: 1e3 * statistics.mean(w[i] for w in later) if later else 0.0  # noqa: E731
    summary = {"ranks": world, "steps": len(step_seconds), "saves": len(save_waits),
               "save_mode": args.save_mode,
               "step_ms_median": 1e3 * statistics.median(step_seconds) if step_seconds else 0.0,
               "state_ms_mean": mean(0), "call_ms_mean": mean(1), "fence_ms_mean": mean(2),
               "per_save_ms": [[round(1e3 * x, 3) for x in w] for w in save_waits]}
    summary["save_wait_ms_mean"] = summary["call_ms_mean"] + summary["fence_ms_mean"]
    print("save wait per save %.3f ms (async_save %.3f + fence %.3f; get_state_dict %.3f more) "
          "against a %.3f ms step" % (summary["save_wait_ms_mean"], summary["call_ms_mean"],
                                      summary["fence_ms_mean"], summary["state_ms_mean"],
                                      summary["step_ms_median"]), flush=True)
    if args.json:
        print(json.dumps(summary), flush=True)


# ---- Main -----------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint root (every rank sees the same)")
    p.add_argument("--steps", type=int, default=30, help="train until this step")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--resume", action="store_true",
                   help="continue from --ckpt's newest checkpoint (from step 0 when it has none)")
    p.add_argument("--resume-from", metavar="PATH",
                   help="continue from this checkpoint (or root's newest) instead; saves still "
                        "go to --ckpt")
    p.add_argument("--global-batch", type=int, default=12,
                   help="samples per step over all ranks (a multiple of the world size)")
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--total-steps", type=int, default=100, help="length of the cosine schedule")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save-mode", choices=("overlap", "snapshot"), default="overlap",
                   help="overlap: the snapshot copy runs during the next forward and backward "
                        "passes, fenced before optimizer.step(); snapshot: async_save copies "
                        "before it returns")
    p.add_argument("--json", action="store_true",
                   help="rank 0's last line: a JSON summary of step time and save waits")
    args = p.parse_args()
    if args.save_every < 1:  # 0 divided by zero after the first step; a negative one saved by |k|
        p.error("--save-every must be at least 1, not %d" % args.save_every)

    torch.set_num_threads(1)  # same kernels every run, and polite on a shared machine
    # cuBLAS is deterministic only with a fixed workspace; an op without a deterministic kernel
    # (not on the CPU path) warns rather than stops the job. Not yet run on a GPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = init_distributed()
    import shardckpt  # after init: under torchrun its default communicator is this job's group
    # SIGTERM (torchrun, Slurm) and SIGUSR1 (launch/mpirun.sh, Slurm's --signal) only set a flag
    # from here on; every rank asks after each step, and all stop after the same one.
    watcher = shardckpt.PreemptionWatcher()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        sys.exit("train_fsdp2: --global-batch %d is not a multiple of the world size %d"
                 % (args.global_batch, world))

    torch.manual_seed(args.seed)  # the same initial weights on every rank, before sharding
    random.seed(args.seed + rank)
    model = TinyTransformer(args.vocab, args.dim, args.heads, args.layers, args.seq).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)

    def schedule(step: int) -> float:  # linear warmup, then cosine to 10%
        if step < args.warmup:
            return (step + 1) / args.warmup
        done = min(1.0, (step - args.warmup) / max(1, args.total_steps - args.warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, schedule)
    step, position = 0, 0
    if not args.resume and not args.resume_from:
        # --resume forgotten: the run would train to its first save and fail there, or with a
        # later step mix a new run into the old root (and retention delete the old checkpoints).
        newest = newest_step(args.ckpt, device)
        if newest >= 0:
            if rank == 0:
                print("error: --ckpt %s already holds checkpoints (the newest step %d): add --resume to "
                      "continue from it, or give a new --ckpt for a new run" % (args.ckpt, newest),
                      file=sys.stderr, flush=True)
            dist.destroy_process_group()
            return 1
    # A --ckpt the run cannot write is found now, not at its first save (rank 0 decides, all agree).
    unwritable = ""
    if rank == 0:
        from shardckpt import _core
        code, message, _ = _core.check_save_root(os.fsencode(args.ckpt))  # before making the folder
        try:
            if code != "OK":
                raise OSError(message)
            os.makedirs(args.ckpt, exist_ok=True)
            if not os.access(args.ckpt, os.W_OK):
                unwritable = "not writable"
        except OSError as error:
            unwritable = str(error)
    if refused_on_rank0(args.ckpt, unwritable, device, rank):
        return 1
    if args.resume and not args.resume_from and newest_step(args.ckpt, device) < 0:
        if rank == 0:
            print("no checkpoint in %s yet: starting at step 0" % args.ckpt, flush=True)
    elif args.resume or args.resume_from:
        step, position = resume(args, model, optim, sched, rank)
    if args.resume_from and not (args.resume and step >= newest_step(args.ckpt, device)):
        # Saves into a root holding a later step are refused (they would go back in time):
        # said before training, as the C++ trainer does, not at each save.
        newest = newest_step(args.ckpt, device)
        if newest > step:
            if rank == 0:
                print("error: --ckpt %s holds step %d, later than step %d resumed from %s: its saves would be "
                      "refused; with --resume-from OLD, pass --ckpt NEW_ROOT" % (args.ckpt, newest, step, args.resume_from),
                      file=sys.stderr, flush=True)
            dist.destroy_process_group()
            return 1
    # A step folder in the way of a later save (someone's files in it): found now, as the C++
    # trainer does, not when that step is reached and every rank fails there.
    in_the_way = ""
    if rank == 0:
        from shardckpt import _core
        code, message, _ = _core.check_planned_step_folders(os.fsencode(args.ckpt), step, args.steps, args.save_every)
        in_the_way = message if code != "OK" else ""
    if refused_on_rank0(args.ckpt, in_the_way, device, rank):
        return 1

    handle = None
    started = time.time()
    step_seconds, save_waits = [], []  # per step; per save: how long the loop was held up
    stopped = None
    while step < args.steps and not stopped:
        began = time.perf_counter()
        tokens = local_batch(args, position, rank, world).to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()  # FSDP2 averages the gradients over ranks: the global batch's mean
        if save_waits and save_waits[-1][2] is None:
            # The last step's save copied the state while this forward and backward ran;
            # the optimizer may change it once the copy is done.
            save_waits[-1][2] = handle.fence()
        optim.step()
        optim.zero_grad(set_to_none=True)
        sched.step()
        step += 1
        position += args.global_batch
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        if rank == 0:
            print("step %d loss %r" % (step, (reported / world).item()), flush=True)
        stopped = watcher.should_stop()  # collective: the same answer on every rank
        if stopped and rank == 0:
            print("stop requested (%s on rank %d, %.2f s ago): final checkpoint of step %d"
                  % (stopped.signal, stopped.first_rank, stopped.seconds_since, step), flush=True)
        if step % args.save_every == 0 or step == args.steps or stopped:
            # Overlap: returns before the copy (fenced above, in the next step, before
            # optimizer.step()). Snapshot: returns once the state is copied. Either way the files
            # are written in the background; the next async_save (or the wait below) waits.
            overlap = args.save_mode == "overlap"
            t0 = time.perf_counter()
            state = checkpoint_state(model, optim, sched, position, step)
            t1 = time.perf_counter()
            # The previous save's persist: async_save would wait for it anyway; its outcome is
            # reported here, and a failure ends the run (exit 1) as in the C++ trainer.
            if handle is not None and not finish(handle, rank):
                dist.destroy_process_group()
                return 1
            handle = shardckpt.async_save(state, args.ckpt, step, copy_while_training=overlap)
            save_waits.append([t1 - t0, time.perf_counter() - t1, None if overlap else 0.0])
            if rank == 0:
                print("checkpoint step %d started" % step, flush=True)
        step_seconds.append(time.perf_counter() - began)
    if handle is not None:
        if save_waits[-1][2] is None:  # no step after the last save: its copy is waited for
            save_waits[-1][2] = handle.fence()
        if not finish(handle, rank):
            dist.destroy_process_group()
            return 1
    watcher.close(ignore_late_signals=True)  # done: a stop forwarded while exiting must not kill the rank
    if rank == 0:
        print("%s: %d ranks, step %d, %.1f s" % ("stopped" if stopped else "done", world, step,
                                                 time.time() - started), flush=True)
        summarize(args, world, step_seconds, save_waits)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as stop:  # sys.exit("...") on a bad flag or setup: its text, status 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - a shardckpt or torch error: its traceback, status 1
        import traceback
        traceback.print_exc()
        code = 1
    # A gloo worker thread drops its reference to a finished collective (and so to a tensor the
    # script already let go of, e.g. newest_step's) a moment after wait() returns; when that
    # moment falls in interpreter finalization, taking the GIL there aborts the process
    # ("terminate called without an active exception", seen on the exit just after an error;
    # pytorch/pytorch#190489). Everything is written, committed and the group destroyed: run the
    # exit handlers (shardckpt's, MPI_Finalize under mpirun) while the interpreter is whole, then
    # exit without finalizing it.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
