#!/usr/bin/env bash
# stuck_before_mpi.sh PYTHON MODULE_DIR WORK_DIR: under mpirun, a rank stuck before its first
# checkpoint call (a hung import, a slow file system) never starts MPI; Python starts it at
# world() or the first save, and MPI_Init_thread waits for every rank with no deadline: the other
# ranks hung there for good, printing nothing. They now end after SHARDCKPT_COLLECTIVE_TIMEOUT_S,
# saying why, and mpirun ends the job.
set -euo pipefail
py=$1 module_dir=$2 work=$3
"$py" -c 'import torch' 2> /dev/null || { echo "skipped: $py has no torch"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
cat > "$work/stuck.py" <<'PY'
import os
import time

import shardckpt

if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    time.sleep(float(os.environ.get("STUCK_SECONDS", "300")))  # stuck before its first checkpoint call
shardckpt.world()
print("rank %s got past MPI's start" % os.environ.get("OMPI_COMM_WORLD_RANK"), flush=True)
PY
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}" SHARDCKPT_COLLECTIVE_TIMEOUT_S=3
SECONDS=0
set +e
timeout 150 mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np 2 \
  -x PYTHONPATH -x SHARDCKPT_COLLECTIVE_TIMEOUT_S "$py" "$work/stuck.py" > "$work/stuck.log" 2>&1
rc=$?
set -e
fail() { cat "$work/stuck.log"; echo "$1"; exit 1; }
[ $rc != 124 ] || fail "the job hung in MPI's start with a rank that never came"
[ $rc != 0 ] || fail "the job succeeded with a rank that never started MPI"
grep -q "MPI_Init_thread has not finished after 3 s (SHARDCKPT_COLLECTIVE_TIMEOUT_S): a rank of the job has not started MPI" \
  "$work/stuck.log" || fail "rank 0 did not say why it ended"
! grep -q "got past MPI's start" "$work/stuck.log" || fail "a rank got past MPI's start"
[ $SECONDS -lt 90 ] || fail "the job took ${SECONDS} s to end"
SECONDS_STUCK=$SECONDS
# A deadline of more than 30 years (or inf) is none: as a wait it overflowed and expired at once.
for huge in inf 99999999999; do
  SHARDCKPT_COLLECTIVE_TIMEOUT_S=$huge STUCK_SECONDS=0 timeout 150 mpirun --oversubscribe --allow-run-as-root \
    --mca btl self,vader,tcp -np 2 -x PYTHONPATH -x SHARDCKPT_COLLECTIVE_TIMEOUT_S -x STUCK_SECONDS "$py" "$work/stuck.py" \
    > "$work/huge.log" 2>&1 || { cat "$work/huge.log"; echo "a job with SHARDCKPT_COLLECTIVE_TIMEOUT_S=$huge failed"; exit 1; }
  [ "$(grep -o "got past MPI's start" "$work/huge.log" | wc -l)" = 2 ] || { cat "$work/huge.log"; echo "timeout $huge"; exit 1; }
done
echo "stuck before MPI's start: the job ended after ${SECONDS_STUCK} s, saying why; huge timeouts are none"
