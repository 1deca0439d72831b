#!/usr/bin/env bash
# peer_dies.sh PYTHON MODULE_DIR WORK_DIR: under torchrun (gloo), a rank killed inside a save
# leaves the other rank an error that names the rank that did not join, in a line (it was gloo's
# "Connection reset by peer ... GLHF" followed by shardckpt's own Python frames); and a
# SHARDCKPT_COLLECTIVE_TIMEOUT_S that is not a number is said to be ignored (it silently waited
# 30 minutes), as under mpirun. And a job whose ranks caught DeadlineExceeded and then called
# destroy_process_group() exits at once, under this torch and torch 2.x (it hung at exit for
# gloo's own timeout, 30 minutes by default, with the timed-out collective still queued), each
# rank naming the collective the other is in.
set -euo pipefail
py=$1 module_dir=$2 work=$3
"$py" -c 'import torch.distributed.run' 2> /dev/null || { echo "skipped: $py has no torch with torchrun"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}"
# torchrun's agent ends the other workers once it sees one die (every --monitor_interval): the
# survivor's error is what a launcher that leaves it running (srun, a script) shows; the agent
# looks rarely here so that it does not kill rank 0 before it prints.
run() {  # ROOT LOG [MODE], with the environment given before it (PY: another python; MONITOR: s)
  local port python=${PY:-$py}
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  timeout 180 "$python" -m torch.distributed.run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port "$port" \
    --redirects 1 --tee 1 --monitor_interval "${MONITOR:-60}" --nproc_per_node 2 "$(dirname "$0")/peer_dies.py" "$1" ${3:-} > "$2" 2>&1
}
set +e
SHARDCKPT_COLLECTIVE_TIMEOUT_S=60 SHARDCKPT_FAILPOINTS="save.write_data@1=kill" run "$work/killed" "$work/killed.log"
rc=$?
set -e
[ $rc != 124 ] || { cat "$work/killed.log"; echo "the job hung with a rank killed in its save"; exit 1; }
line=$(grep -o "rank 0 raised.*" "$work/killed.log") || { cat "$work/killed.log"; echo "rank 0 did not raise"; exit 1; }
case "$line" in
  *"rank 0 raised Aborted: "*"rank 1 of the group had not reached it a second later (a rank that died or exited closed its connection"*) ;;
  *) cat "$work/killed.log"; echo "rank 0's error does not name rank 1: $line"; exit 1 ;;
esac
! grep -q "At:\|_torch_comm.py(" "$work/killed.log" || { cat "$work/killed.log"; echo "Python frames in the error"; exit 1; }
MONITOR=1 SHARDCKPT_COLLECTIVE_TIMEOUT_S=10s run "$work/typo" "$work/typo.log" ||
  { cat "$work/typo.log"; echo "the save with a malformed timeout failed"; exit 1; }
[ "$(grep -c "ignoring SHARDCKPT_COLLECTIVE_TIMEOUT_S='10s' (want seconds >= 0); using 1800" "$work/typo.log")" = 2 ] &&
  [ "$(grep -c "rank [01]: saved" "$work/typo.log")" = 2 ] || { cat "$work/typo.log"; echo "the malformed timeout was not said"; exit 1; }
source "$(dirname "$0")/pythons.sh" "$py"
for python in "${pythons[@]}"; do
  log=$work/deadline-$(basename "$(dirname "$(dirname "$python")")").log
  started=$(date +%s)
  set +e
  PY=$python MONITOR=1 SHARDCKPT_COLLECTIVE_TIMEOUT_S=5 run "$work/deadline" "$log" deadline
  rc=$?
  set -e
  took=$(( $(date +%s) - started ))
  [ $rc = 0 ] && [ $took -lt 60 ] || { cat "$log"; echo "$python: exit $rc after $took s, the deadline being 5 s"; exit 1; }
  [ "$(grep -c "rank [01] raised DeadlineExceeded: " "$log")" = 2 ] && [ "$(grep -c "rank [01]: end of script" "$log")" = 2 ] ||
    { cat "$log"; echo "$python: both ranks were to raise DeadlineExceeded and end their script"; exit 1; }
  # Each names the collective the other is in (it said "another rank never joined it").
  [ "$(grep -c "every rank reached this turn, but rank [01] is in [a-z_]*: the ranks are in different calls" "$log")" = 2 ] ||
    { cat "$log"; echo "$python: the ranks' different collectives were not named"; exit 1; }
  rm -rf "$work/deadline"
  echo "$python: DeadlineExceeded caught, process group destroyed, exit after $took s"
done
echo "rank 0: $line"
