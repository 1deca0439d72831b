#!/usr/bin/env bash
# unwaited_async.sh PYTHON MODULE_DIR WORK_DIR: a torchrun job of 2 that never waits for its
# async_save, ending normally or by an exception, commits that checkpoint and exits. (Python
# dropped the saver at exit while holding the GIL, which the persist's collectives over the gloo
# group needed: the job hung forever, and no checkpoint was written.)
set -euo pipefail
py=$1 module_dir=$2 work=$3
"$py" -c 'import torch' 2> /dev/null || { echo "skipped: $py has no torch"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}" SHARDCKPT_COLLECTIVE_TIMEOUT_S=30
for how in exit raise; do
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  set +e
  timeout 180 "$py" -m torch.distributed.run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port "$port" \
    --redirects 1 --tee 1 --nproc_per_node 2 "$(dirname "$0")/unwaited_async.py" "$work/$how" "$how" > "$work/$how.log" 2>&1
  rc=$?
  set -e
  [ $rc != 124 ] || { cat "$work/$how.log"; echo "$how: the job hung at exit with its async save in flight"; exit 1; }
  if [ $how = raise ]; then
    [ $rc != 0 ] && grep -q "loss is NaN" "$work/$how.log" || { cat "$work/$how.log"; echo "raise: exit $rc"; exit 1; }
  else
    [ $rc = 0 ] || { cat "$work/$how.log"; echo "exit: exit $rc"; exit 1; }
  fi
  "$py" -c 'import shardckpt, sys; r = shardckpt.verify(sys.argv[1]); assert shardckpt.inspect(sys.argv[1])["step"] == 3' \
    "$work/$how" || { cat "$work/$how.log"; echo "$how: no sound checkpoint of step 3"; exit 1; }
  echo "$how: exit $rc, step 3 committed and verified"
done
