#!/usr/bin/env bash
# Writes the DCP folders the DCP reading tests read (dcp_read_gen.py), with torch 2.x's own
# dcp.save: OUT/single (one process, no process group) and OUT/dist (2 ranks over gloo).
# Skipped (77) without the torch 2.x environment, failed when SHARDCKPT_REQUIRE_TORCH2=1.
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
if ! py=$(bash "$here/../../launch/torch2_venv.sh" --find); then
  [ "${SHARDCKPT_REQUIRE_TORCH2:-0}" = 1 ] && { echo "the torch 2.x environment is required"; exit 1; }
  echo "skipped: no torch 2.x environment"
  exit 77
fi
rm -rf "$out"
mkdir -p "$out"
"$py" "$here/dcp_read_gen.py" single "$out/single"
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 \
  --master_port "$port" --nproc_per_node 2 "$here/dcp_read_gen.py" dist "$out/dist"
ls "$out/single/.metadata" "$out/dist/.metadata" > /dev/null
