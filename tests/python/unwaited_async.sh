#!/usr/bin/env bash
# unwaited_async.sh PYTHON MODULE_DIR WORK_DIR: a torchrun job of 2 that never waits for its
# async_save, ending normally or by an exception, commits that checkpoint and exits. (Python
# dropped the saver at exit while holding the GIL, which the persist's collectives over the gloo
# group needed: the job hung forever, and no checkpoint was written.) One whose save fails with no
# wait() to see it (a full disk, its process group destroyed) logs the error on every rank (it
# ended silently, without its checkpoint), its exit status its own; a failure a later save
# passes over unwaited is logged at that save.
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

# expect_logged HOW RC_WANTED TEXT: both ranks logged the unseen failure of step 3, one at least
# with TEXT (a rank whose peer destroyed its group may see the connection closed first).
expect_logged() {
  local how=$1 rc_wanted=$2 text=$3 log=$work/$1.log rank
  for rank in 0 1; do
    grep -qF "[shardckpt E rank $rank] the async save of step 3 failed, and no wait() saw it" "$log" ||
      { cat "$log"; echo "$how: rank $rank did not log the failure of step 3"; exit 1; }
  done
  grep -F "the async save of step 3 failed, and no wait() saw it" "$log" | grep -qF "$text" ||
    { cat "$log"; echo "$how: no rank logged the failure of step 3 with '$text'"; exit 1; }
  [ "$rc" = "$rc_wanted" ] || { cat "$log"; echo "$how: exit $rc, wanted $rc_wanted"; exit 1; }
  echo "$how: exit $rc, the failure logged on both ranks"
}
for how in enospc destroy twice; do
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # enospc and twice: the first save's data write fails on rank 1 (the second save's succeeds).
  set +e
  SHARDCKPT_FAILPOINTS=$([ $how = destroy ] || echo "save.write_data@1#1=ENOSPC") \
    timeout 180 "$py" -m torch.distributed.run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port "$port" \
    --redirects 1 --tee 1 --nproc_per_node 2 "$(dirname "$0")/unwaited_async.py" "$work/$how" \
    "$([ $how = enospc ] && echo exit || echo $how)" > "$work/$how.log" 2>&1
  rc=$?
  set -e
  [ $rc != 124 ] || { cat "$work/$how.log"; echo "$how: the job hung"; exit 1; }
  case $how in
    enospc) expect_logged $how 0 "NoSpace: save of step 3 failed: rank 1: writing" ;;
    destroy) expect_logged $how 0 "the process group was destroyed while shardckpt still needed it" ;;
    twice) expect_logged $how 0 "NoSpace"
           "$py" -c 'import shardckpt, sys; shardckpt.verify(sys.argv[1]); assert shardckpt.inspect(sys.argv[1])["step"] == 4' \
             "$work/$how" || { cat "$work/$how.log"; echo "twice: no sound checkpoint of step 4"; exit 1; } ;;
  esac
  if [ $how != twice ] && ls "$work/$how" 2> /dev/null | grep -q '^step-[0-9]*$'; then
    ls -la "$work/$how"; echo "$how: a failed save committed a step folder"; exit 1
  fi
done
