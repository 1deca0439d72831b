#!/usr/bin/env bash
# The one script to run on a lent GPU machine (the device tool), after building here:
#   run: bash benchmarks/gpu_check.sh   (with carry: build/bin/cuda_test, build/bin/bench_cuda)
# Runs the CUDA tests and the device benchmark, and leaves their output in $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}; mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
build/bin/cuda_test 2>&1 | tee "$out/cuda_test.txt"
build/bin/bench_cuda --bytes 4GiB --tensors 16 --dir /tmp/shardckpt-bench-cuda 2>&1 | tee "$out/bench_cuda.txt"
build/bin/bench_cuda --bytes 4GiB --tensors 16 --dir /dev/shm/shardckpt-bench-cuda 2>&1 | tee "$out/bench_cuda_shm.txt"
