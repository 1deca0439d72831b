#!/bin/bash
# Times the CLI's many-small-tensor steps for two shardckpt binaries, alternating, with a pause
# before each step (as a user runs one tool after another: this VM's host takes back free memory
# within seconds, so back-to-back runs hide the cost of fresh memory). Run in a folder that
# benchmarks/bench_small_tensors.sh left (state.pt, r16/).
#   bash benchmarks/ab_tools.sh OLD_BINARY NEW_BINARY DATA_DIR [ROUNDS] [PAUSE_S]
# Prints one line per step and binary, sorted by step: "<old|new> <step> <seconds> s".
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: bash benchmarks/ab_tools.sh OLD_BINARY NEW_BINARY DATA_DIR [ROUNDS] [PAUSE_S]" >&2
  exit 2
fi
old=$(realpath "$1"); new=$(realpath "$2"); data=$3; rounds=${4:-3}; pause=${5:-3}
[[ $old != "$new" ]] || { echo "OLD_BINARY and NEW_BINARY are the same file: copy one aside first" >&2; exit 2; }
[[ -f "$data/state.pt" && -d "$data/r16" ]] || { echo "$data lacks state.pt or r16/ (run bench_small_tensors.sh first)" >&2; exit 2; }
# Outputs on the data's own file system: a /tmp on tmpfs would time other writes.
scratch=$(mktemp -d "$data/ab_tools.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$data"
step() {  # tag name command...
  local tag=$1 name=$2; shift 2
  sleep "$pause"
  local start ms
  start=$(date +%s%N)
  "$@" > /dev/null
  ms=$((($(date +%s%N) - start) / 1000000))
  printf '%s %s %d.%03d s\n' "$tag" "$name" $((ms / 1000)) $((ms % 1000))
}
for _ in $(seq "$rounds"); do
  for binary in "$old" "$new"; do
    tag=$([[ $binary == "$new" ]] && echo new || echo old)
    rm -rf "$scratch"/*
    step "$tag" reshard64 "$binary" reshard r16 --out "$scratch/r64" --world-size 64 --layout dim0
    step "$tag" consolidate64 "$binary" consolidate "$scratch/r64" --out "$scratch/c64.pt"
    step "$tag" consolidate16 "$binary" consolidate r16 --out "$scratch/c16.pt"
    step "$tag" import2 "$binary" import state.pt --out "$scratch/ri" --world-size 2 --layout dim0
  done
done | sort -k2,2 -k1,1
