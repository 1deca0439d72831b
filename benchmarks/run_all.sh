#!/usr/bin/env bash
# Runs every benchmark with the settings recorded in benchmarks/README.md; prints their output:
# first benchmarks/goals.sh (one measurement per goal of the performance issue), then the rest.
#   bash benchmarks/run_all.sh [DISK_DIR] [SHM_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
disk=${1:-/tmp/shardckpt-bench}; shm=${2:-/dev/shm/shardckpt-bench}
mpi="launch/mpirun.sh"
bash benchmarks/goals.sh "$disk" "$shm"
echo; echo "### the other benchmarks"
$mpi -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout replicated --dir "$disk" --iters 3
for layout in flat dim0 replicated; do
  extra=(); [ "$layout" = flat ] && extra=(--async)
  $mpi -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout $layout --dir "$shm" --iters 3 "${extra[@]}"
done
$mpi -np 3 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim1 --dir "$disk"
$mpi -np 2 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim1 --dir "$disk"
build/bin/bench_async_overlap --bytes 512MiB --tensors 32 --step-ms 40 --dir "$disk/overlap"
for mode in --unaligned --stage; do build/bin/bench_shm_save --bytes 1GiB --tensors 64 --dir "$shm/one-pass" $mode; done
build/bin/bench_consolidate --total-bytes 4GiB --save-ranks 4 --format torch --dir "$disk"
build/bin/bench_consolidate --total-bytes 4GiB --save-ranks 4 --format safetensors --dir "$disk"
if [ -x build/bin/bench_cuda ]; then build/bin/bench_cuda --bytes 4GiB --tensors 16 --dir "$disk"; fi
$mpi -np 2 build/bin/bench_preempt_check --iters 20000
$mpi -np 8 build/bin/bench_preempt_check --iters 20000
