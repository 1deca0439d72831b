#!/usr/bin/env bash
# One pytest run under mpirun: run_case.sh PYTHON MODULE_DIR WORK_DIR NP PYTEST_ARGS...
# MODULE_DIR holds the built package (build/python). The work dir is emptied first, except for
# SHARDCKPT_PY_PHASE=load, which reads what the save phase left there; collectives
# time out after 60 s so a test that fails on one rank cannot hang the others for long.
set -euo pipefail
py=$1 module_dir=$2 work=$3 np=$4
shift 4
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}" SHARDCKPT_PY_WORK="$work"
export SHARDCKPT_COLLECTIVE_TIMEOUT_S=${SHARDCKPT_COLLECTIVE_TIMEOUT_S:-60}
export SHARDCKPT_PY_PHASE=${SHARDCKPT_PY_PHASE:-}
[ "$SHARDCKPT_PY_PHASE" = load ] || rm -rf "$work"
mkdir -p "$work"
cd "$(dirname "$0")"
exec mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np "$np" \
  -x PYTHONPATH -x SHARDCKPT_PY_WORK -x SHARDCKPT_COLLECTIVE_TIMEOUT_S -x SHARDCKPT_PY_PHASE \
  "$py" -m pytest -q --color=no -p no:cacheprovider "$@"
