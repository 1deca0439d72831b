#!/usr/bin/env bash
# Launches the Python main job (launch/train_fsdp2.py) under mpirun or torchrun, with torch 2.x:
#   launch/train_fsdp2.sh -np 4 --ckpt /tmp/run --steps 20             # mpirun (launch/mpirun.sh)
#   launch/train_fsdp2.sh --torchrun 2 --ckpt /tmp/run --steps 30 --resume
# The interpreter is $SHARDCKPT_PYTHON, else the cached torch 2.x environment of
# launch/torch2_venv.sh (created on first use). shardckpt is imported from where that Python
# finds it (pip install .); failing that, from this clone's build tree (build/python).
# Under mpirun, torch.distributed needs a rendezvous besides MPI: MASTER_ADDR (127.0.0.1 unless
# set: on several hosts, export rank 0's address) and a free MASTER_PORT go to every rank, and
# each rank takes its rank and size from OpenMPI's variables (see launch/rank_env.sh).
set -euo pipefail
. "$(dirname "$0")/usage.sh"
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: $0 (-np N | --torchrun N) TRAIN_FSDP2_ARGS... (see: $0 -np 1 --help)"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
launcher=$1 np=$2
shift 2
case "$launcher" in -np|-n|--torchrun) ;; *) echo "$usage" >&2; exit 2 ;; esac
py=${SHARDCKPT_PYTHON:-$(bash "$here/torch2_venv.sh")}
if ! "$py" -c 'import shardckpt._core' 2> /dev/null; then
  export PYTHONPATH="$here/../build/python${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c 'import shardckpt._core' || {
    echo "$0: shardckpt is not importable by $py: pip install . (or bash launch/build.sh)" >&2; exit 1; }
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
if [ "$launcher" = --torchrun ]; then
  exec "$py" -m torch.distributed.run --nnodes 1 --nproc_per_node "$np" \
    --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-$port}" \
    "$here/train_fsdp2.py" "$@"
fi
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1} MASTER_PORT=${MASTER_PORT:-$port} PYTHONPATH=${PYTHONPATH:-}
exec bash "$here/mpirun.sh" -np "$np" -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS \
  -x PYTHONPATH "$py" "$here/train_fsdp2.py" "$@"
