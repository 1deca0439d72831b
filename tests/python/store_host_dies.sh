#!/usr/bin/env bash
# store_host_dies.sh PYTHON MODULE_DIR WORK_DIR: 3 processes started as srun or a script starts
# them (env://, MASTER_ADDR/PORT, RANK, WORLD_SIZE: rank 0 hosts the job's c10d store), rank 0
# killed inside a save. The others end within seconds with an error that names their rank and
# the store's host; they said "torch.distributed gather: DistNetworkError: Broken pipe" (found
# by a torch 2.x user's trial).
set -euo pipefail
py=$1 module_dir=$2 work=$3
"$py" -c 'import torch.distributed' 2> /dev/null || { echo "skipped: $py has no torch.distributed"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}"
source "$(dirname "$0")/pythons.sh" "$py"
for python in "${pythons[@]}"; do
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  name=$(basename "$(dirname "$(dirname "$python")")")
  pids=()
  started=$(date +%s)
  for rank in 0 1 2; do
    # Ranks 1 and 2 reach the save's next collective a second after rank 0 died in its writes.
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=3 RANK=$rank SHARDCKPT_COLLECTIVE_TIMEOUT_S=60 \
      SHARDCKPT_FAILPOINTS="save.write_data@0=kill;save.write_data@1=sleep:1000;save.write_data@2=sleep:1000" \
      timeout 120 "$python" "$(dirname "$0")/peer_dies.py" "$work/root-$name" > "$work/$name-$rank.log" 2>&1 &
    pids+=($!)
  done
  rcs=()
  for pid in "${pids[@]}"; do
    set +e; wait "$pid"; rcs+=($?); set -e
  done
  took=$(( $(date +%s) - started ))
  [ "${rcs[1]}" != 124 ] && [ "${rcs[2]}" != 124 ] && [ $took -lt 60 ] ||
    { tail -n 5 "$work/$name"-*.log; echo "$python: the survivors hung ($took s, exits ${rcs[*]})"; exit 1; }
  for rank in 1 2; do
    line=$(grep -o "rank $rank raised.*" "$work/$name-$rank.log") ||
      { cat "$work/$name-$rank.log"; echo "$python: rank $rank did not raise"; exit 1; }
    case "$line" in
      *"rank $rank raised Aborted: "*"rank $rank: torch.distributed "*"failed: the job's c10d store at 127.0.0.1:$port did not answer"*"the process that hosts it (rank 0 of the job where it was started with env://"*) ;;
      *) cat "$work/$name-$rank.log"; echo "$python: rank $rank's error does not say the store's host is gone: $line"; exit 1 ;;
    esac
  done
  echo "$python: exits ${rcs[*]} after $took s; $line"
done
