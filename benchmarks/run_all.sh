#!/usr/bin/env bash
# Runs every benchmark with the settings recorded in benchmarks/README.md; prints their output.
#   bash benchmarks/run_all.sh [DISK_DIR] [SHM_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
disk=${1:-/tmp/shardckpt-bench}; shm=${2:-/dev/shm/shardckpt-bench}
mpi="launch/mpirun.sh"
for dir in "$disk" "$shm"; do
  for layout in flat dim0 replicated; do
    extra=(); [ "$layout" = flat ] && extra=(--async)
    $mpi -np 2 build/bin/bench_save_load --bytes-per-rank 1GiB --tensors 16 --layout $layout --dir "$dir" --iters 3 "${extra[@]}"
  done
done
$mpi -np 3 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim0 --dir "$disk"
$mpi -np 3 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim1 --dir "$disk"
$mpi -np 2 build/bin/bench_reshard --save-ranks 8 --total-bytes 1GiB --wanted dim1 --dir "$disk"
$mpi -np 4 build/bin/bench_reshard --save-ranks 2 --total-bytes 1GiB --wanted dim0 --dir "$disk"
build/bin/bench_plan_scale --entries 1000 --save-ranks 1000 --load-ranks 768
for dir in "$disk" "$shm"; do
  $mpi -np 2 build/bin/bench_replicated_load --small 4000 --small-bytes 4096 --large 4 --large-bytes 32MiB --dir "$dir/replicated"
done
for ms in 300 40; do build/bin/bench_async_overlap --bytes 512MiB --tensors 32 --step-ms $ms --dir "$disk/overlap"; done
for mode in "" --unaligned --stage; do build/bin/bench_shm_save --bytes 1GiB --tensors 64 --dir "$shm/one-pass" $mode; done
build/bin/bench_consolidate --total-bytes 4GiB --save-ranks 4 --format torch --dir "$disk"
build/bin/bench_consolidate --total-bytes 4GiB --save-ranks 4 --format safetensors --dir "$disk"
python3 benchmarks/bench_dcp.py --dirs "$disk" "$shm" --save-ranks 2 --load-ranks 3 --total-bytes 1GiB --iters 3
if [ -x build/bin/bench_cuda ]; then build/bin/bench_cuda --bytes 4GiB --tensors 16 --dir "$disk"; fi
$mpi -np 2 build/bin/bench_preempt_check --iters 20000
$mpi -np 8 build/bin/bench_preempt_check --iters 20000
