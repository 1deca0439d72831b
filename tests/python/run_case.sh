#!/usr/bin/env bash
# One pytest run under mpirun: run_case.sh PYTHON MODULE_DIR WORK_DIR NP PYTEST_ARGS...
# (PYTHON torch2: the cached torch 2.x environment of launch/torch2_venv.sh; skipped when it is
# missing, failed instead when SHARDCKPT_REQUIRE_TORCH2=1, as the README's test command sets.)
# (NP torchrun:N: under torchrun instead, N processes over a gloo process group.)
# MODULE_DIR holds the built package (build/python). The work dir is emptied first, except for
# SHARDCKPT_PY_PHASE=load, which reads what the save phase left there; collectives
# time out after 60 s so a test that fails on one rank cannot hang the others for long.
set -euo pipefail
py=$1 module_dir=$2 work=$3 np=$4
shift 4
if [ "$py" = torch2 ]; then
  if ! py=$(bash "$(dirname "$0")/../../launch/torch2_venv.sh" --find); then
    [ "${SHARDCKPT_REQUIRE_TORCH2:-0}" = 1 ] && { echo "the torch 2.x environment is required"; exit 1; }
    echo "skipped: no torch 2.x environment"
    exit 77
  fi
fi
if ! "$py" -c 'import pytest' 2> /dev/null; then
  echo "skipped: $py has no pytest (Debian: apt-get install python3-pytest)"
  exit 77
fi
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}" SHARDCKPT_PY_WORK="$work"
export SHARDCKPT_COLLECTIVE_TIMEOUT_S=${SHARDCKPT_COLLECTIVE_TIMEOUT_S:-60}
export SHARDCKPT_PY_PHASE=${SHARDCKPT_PY_PHASE:-}
[ "$SHARDCKPT_PY_PHASE" = load ] || rm -rf "$work"
mkdir -p "$work"
cd "$(dirname "$0")"
if [[ $np == torchrun:* ]]; then  # the job's own process group, no MPI
  # A free port of our own (--standalone always takes 29400, so two runs at once would meet);
  # --redirects/--tee 1: torch 1.13's parser of their default "0" fails on Python 3.11.
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  exec "$py" -m torch.distributed.run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 \
    --master_port "$port" --redirects 1 --tee 1 --nproc_per_node "${np#torchrun:}" \
    -m pytest -q --color=no -p no:cacheprovider "$@"
fi
exec mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np "$np" \
  -x PYTHONPATH -x SHARDCKPT_PY_WORK -x SHARDCKPT_COLLECTIVE_TIMEOUT_S -x SHARDCKPT_PY_PHASE \
  "$py" -m pytest -q --color=no -p no:cacheprovider "$@"
