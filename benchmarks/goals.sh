#!/usr/bin/env bash
# One measurement for each goal of the performance issue (issue 14), in the order of the goals
# table at the top of benchmarks/README.md; every benchmark measures its own baselines (fio,
# torch.save, DCP, a plain copy) in the same run, on the same folder and bytes. Each step prints a
# "### goal: ..." header before its benchmark's output, so a log of one run fills the table.
#   bash benchmarks/goals.sh [DISK_DIR] [SHM_DIR] 2>&1 | tee goals.log
# About 8 minutes on the project's 2-core VM (2026-12-07); needs the build (launch/build.sh) and, for DCP and
# the training loop, the torch 2.x venv (launch/torch2_venv.sh creates it on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
disk=${1:-/tmp/shardckpt-bench}; shm=${2:-/dev/shm/shardckpt-bench}
mpi="launch/mpirun.sh"
goal() { echo; echo "### goal: $*"; date -u +"%Y-%m-%d %H:%M:%S UTC"; }
mkdir -p "$disk" "$shm"

goal "part 2: disk save and load >= 0.95x fio, 1 GiB per rank, 2 ranks (flat; --async: part 7's blocking)"
$mpi -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout flat --dir "$disk" --iters 3 --async
goal "part 2: disk save and load >= 0.95x fio, 1 GiB per rank, 2 ranks (dim0)"
$mpi -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout dim0 --dir "$disk" --iters 3
goal "part 2: resharded load 8 -> 3 rows >= 0.9x fio's read, read amplification <= 1.05"
$mpi -np 3 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim0 --dir "$disk"
goal "part 2: resharded load 2 -> 4 rows >= 0.9x fio's read, read amplification <= 1.05"
$mpi -np 4 build/bin/bench_reshard --save-ranks 2 --total-bytes 1GiB --wanted dim0 --dir "$disk"

goal "part 3: tmpfs save >= 0.9x a plain single-copy write"
build/bin/bench_shm_save --bytes 1GiB --tensors 64 --dir "$shm/one-pass"
goal "part 3: tmpfs save >= 2x DCP's (and the loads, on disk too)"
python3 benchmarks/bench_dcp.py --dirs "$shm" "$disk" --save-ranks 2 --load-ranks 3 --total-bytes 1GiB --iters 3

goal "part 4: replicated (DDP) load >= 0.9x every rank reading, tmpfs"
$mpi -np 2 build/bin/bench_replicated_load --small 4000 --small-bytes 4096 --large 4 --large-bytes 32MiB --iters 5 --dir "$shm/replicated"
goal "part 4: replicated (DDP) load >= 0.9x every rank reading, disk"
$mpi -np 2 build/bin/bench_replicated_load --small 4000 --small-bytes 4096 --large 4 --large-bytes 32MiB --iters 5 --dir "$disk/replicated"

goal "part 5: many small tensors, 20,004 tensors: amplification <= 1.05; reshard and consolidate >= 0.5x a copy"
bash benchmarks/bench_small_tensors.sh build/bin "$disk/small" 20000 "16 64"
goal "part 5: many small tensors, 100,004 tensors: amplification <= 1.05; reshard and consolidate >= 0.5x a copy"
bash benchmarks/bench_small_tensors.sh build/bin "$disk/small" 100000 "16 64"
goal "part 5: many small tensors: save and load >= 0.8x fio, 2 ranks"
$mpi -np 2 build/bin/bench_save_load --many-small 20000 --tensors 4 --bytes-per-rank 8MiB --layout dim0 --dir "$disk" --iters 5 --plan-cache
goal "part 5: manifest encode and decode < 0.5 s, 100,000 tensors at 64 ranks"
build/bin/bench_plan_scale --layout small --entries 100000 --save-ranks 64 --manifest-only

goal "part 6: a repeat save's metadata phase < 10% of the first, 1,000,000 chunks"
build/bin/bench_plan_scale --entries 1000 --save-ranks 1000 --load-ranks 768

goal "part 7: async save's blocking part; copy while training (step 300 ms)"
build/bin/bench_async_overlap --bytes 512MiB --tensors 32 --step-ms 300 --iters 5 --dir "$disk/overlap"
goal "part 7: what the Python training loop waits per save (FSDP2, copy while training)"
bash launch/train_fsdp2.sh --torchrun 2 --ckpt "$disk/ov_bench" --steps 24 --save-every 4 \
  --dim 512 --layers 4 --vocab 4096 --seq 64 --heads 8 --save-mode overlap --json
rm -rf "$disk/ov_bench" "$disk/small"
