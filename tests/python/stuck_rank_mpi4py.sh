#!/usr/bin/env bash
# stuck_rank_mpi4py.sh MODULE_DIR WORK_DIR: under mpirun with mpi4py (which starts MPI, so
# shardckpt does not own it), a rank hung inside a save makes the others raise DeadlineExceeded
# naming it, and the job then ends with exit status 3. It used to end only when the allocation
# did: the survivors sat in mpi4py's MPI_Finalize at exit, waiting for the hung rank (a trial,
# 2026-12-07). Uses the cached torch 2.x environment, which holds mpi4py.
set -euo pipefail
module_dir=$1 work=$2
if ! py=$(bash "$(dirname "$0")/../../launch/torch2_venv.sh" --find 2> /dev/null); then
  [ "${SHARDCKPT_REQUIRE_TORCH2:-0}" != 1 ] || { echo "the torch 2.x environment is required"; exit 1; }
  echo "skipped: no torch 2.x environment with mpi4py"; exit 77
fi
rm -rf "$work"; mkdir -p "$work"
cat > "$work/hang.py" <<'PY'
import sys

from mpi4py import MPI
import torch

import shardckpt

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
per = 1000
state = {"w": shardckpt.FlatShard(torch.full((per,), float(rank)), (per * size,), rank * per)}
try:
    shardckpt.save(state, sys.argv[1], step=1, comm=shardckpt.from_mpi4py(MPI.COMM_WORLD))
except shardckpt.DeadlineExceeded as error:
    print("rank %d raised DeadlineExceeded: %s" % (rank, error), flush=True)
print("rank %d: end of script" % rank, flush=True)
PY
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}" SHARDCKPT_COLLECTIVE_TIMEOUT_S=4
# Rank 1 sleeps 120 s in its save's data phase: hung, as far as the others can tell.
export SHARDCKPT_FAILPOINTS="save.write_data@1=sleep:120000"
SECONDS=0
set +e
timeout 100 mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np 3 -x PYTHONPATH \
  -x SHARDCKPT_COLLECTIVE_TIMEOUT_S -x SHARDCKPT_FAILPOINTS "$py" "$work/hang.py" "$work/root" > "$work/hang.log" 2>&1
rc=$?
set -e
fail() { cat "$work/hang.log"; echo "$1"; exit 1; }
[ $rc != 124 ] || fail "the job hung after its survivors' DeadlineExceeded (in MPI_Finalize at exit)"
[ $rc = 3 ] || fail "exit status $rc, not 3 (the abort after a timeout)"
for r in 0 2; do
  grep -q "rank $r raised DeadlineExceeded: .*rank 1 never reached it" "$work/hang.log" ||
    fail "rank $r did not raise DeadlineExceeded naming rank 1"
  grep -q "rank $r: end of script" "$work/hang.log" || fail "rank $r did not reach the end of its script"
done
grep -q "aborting the job: a collective timed out" "$work/hang.log" || fail "no rank said why it aborted the job"
[ $SECONDS -lt 60 ] || fail "the job took ${SECONDS} s to end"
echo "a rank hung under mpi4py: the survivors raised DeadlineExceeded and the job ended after ${SECONDS} s (exit 3)"
