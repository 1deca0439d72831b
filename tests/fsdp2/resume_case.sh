#!/usr/bin/env bash
# The Python main job's resume, end to end:
#   resume_case.sh BUILD_DIR WORK (torchrun|mpirun) NP_SAVE NP_LOAD (exact|close)
# trains launch/train_fsdp2.py on NP_SAVE ranks to step 30 (async checkpoints at 10, 20, 30),
# then resumes its step-20 checkpoint on NP_LOAD ranks to step 30 and compares steps 21-30:
# the same strings (exact) or within 1e-5 relative (close). The step-20 save was still being
# written while the uninterrupted run trained on, so this also checks that async_save kept the
# state as it was when called. Needs the cached torch 2.x environment (launch/torch2_venv.sh):
# skipped (77) without it unless SHARDCKPT_REQUIRE_TORCH2=1. In exact mode, --resume on an empty root
# also starts at step 0 with the uninterrupted losses, and a run stopped by a signal saves the
# step every rank stopped after and resumes from it exactly.
set -euo pipefail
build=$1 work=$2 launcher=$3 np_save=$4 np_load=$5 mode=$6
here=$(cd "$(dirname "$0")" && pwd)
launch=$here/../../launch
if ! py=$(bash "$launch/torch2_venv.sh" --find); then
  [ "${SHARDCKPT_REQUIRE_TORCH2:-0}" = 1 ] && { echo "the torch 2.x environment is required"; exit 1; }
  echo "skipped: no torch 2.x environment"
  exit 77
fi
[ -d "$build/python/shardckpt" ] || { echo "skipped: the Python package was not built"; exit 77; }
export SHARDCKPT_PYTHON=$py PYTHONPATH=$build/python SHARDCKPT_COLLECTIVE_TIMEOUT_S=60
case "$launcher" in
  torchrun) flag=--torchrun ;;
  mpirun) flag=-np ;;
  *) echo "launcher: torchrun or mpirun, not $launcher"; exit 2 ;;
esac
rm -rf "$work"
mkdir -p "$work"
run() {  # log, ranks, train_fsdp2.py flags...
  local log=$1 np=$2
  shift 2
  if ! bash "$launch/train_fsdp2.sh" "$flag" "$np" "$@" > "$log" 2>&1; then
    echo "failed: train_fsdp2.sh $flag $np $*"; tail -40 "$log"; exit 1
  fi
}
run "$work/full.log" "$np_save" --ckpt "$work/full" --steps 30 --save-every 10
run "$work/resumed.log" "$np_load" --ckpt "$work/resumed" --steps 30 --save-every 10 \
  --resume-from "$work/full/step-000000020"
grep -q "^resumed .* at step 20 (saved by $np_save ranks, now $np_load)" "$work/resumed.log" || {
  echo "no resume line in $work/resumed.log:"; head -5 "$work/resumed.log"; exit 1; }
grep -q "^checkpoint step 30 committed" "$work/resumed.log" || {
  echo "the resumed run committed no checkpoint:"; tail -5 "$work/resumed.log"; exit 1; }
if [ "$mode" = exact ]; then how=--exact; else how="--rtol 1e-5"; fi
# shellcheck disable=SC2086
"$py" "$here/compare_losses.py" "$work/full.log" "$work/resumed.log" --steps 21-30 $how
if [ "$mode" = exact ]; then
  # --resume with nothing to resume from (a requeued job's first attempt): starts at step 0.
  run "$work/fresh.log" "$np_save" --ckpt "$work/fresh" --steps 5 --save-every 5 --resume
  grep -q "^no checkpoint in $work/fresh yet: starting at step 0" "$work/fresh.log" || {
    echo "--resume on an empty root:"; head -5 "$work/fresh.log"; exit 1; }
  "$py" "$here/compare_losses.py" "$work/full.log" "$work/fresh.log" --steps 1-5 --exact
  # A failed intermediate checkpoint (rank 1's first data write) ends the run at the next save,
  # exit 1, named on every rank; it used to go unnoticed, only the last save was waited for.
  set +e
  SHARDCKPT_FAILPOINTS="save.write_data@1#1=ENOSPC" bash "$launch/train_fsdp2.sh" "$flag" "$np_save" \
    --ckpt "$work/lost" --steps 30 --save-every 10 > "$work/lost.log" 2>&1
  rc=$?
  set -e
  # Counted anywhere in a line: mpirun may glue one rank's stderr line to another's stdout line.
  [ $rc = 1 ] && [ "$(grep -oE "rank [0-9]+: checkpoint of step 10 failed: NoSpace" "$work/lost.log" | wc -l)" = "$np_save" ] &&
    ! grep -q "^step 21 " "$work/lost.log" || {
    echo "a failed step-10 checkpoint: exit $rc"; tail -20 "$work/lost.log"; exit 1; }
  # --resume-from an earlier step into the root it came from (which holds step 30): refused
  # before training, exit 1, rather than each save failing on.
  set +e
  bash "$launch/train_fsdp2.sh" "$flag" "$np_save" --ckpt "$work/full" --steps 40 --save-every 10 \
    --resume-from "$work/full/step-000000020" > "$work/back.log" 2>&1
  rc=$?
  set -e
  [ $rc = 1 ] && grep -q "error: --ckpt $work/full holds step 30, later than step 20" "$work/back.log" &&
    ! grep -q "^step 21 " "$work/back.log" || {
    echo "resume-from an earlier step into its own root: exit $rc"; tail -20 "$work/back.log"; exit 1; }
  # refused_before_training LOG TEXT WHAT ARGS...: the trainer exits 1 printing TEXT (a grep
  # pattern), having trained no step.
  refused_before_training() {
    local log=$1 text=$2 what=$3 rc=0
    shift 3
    bash "$launch/train_fsdp2.sh" "$flag" "$np_save" "$@" > "$log" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "$text" "$log" && ! grep -q "^step 1 " "$log" || {
      echo "$what: exit $rc"; tail -20 "$log"; exit 1; }
  }
  # --resume forgotten on a root with checkpoints.
  refused_before_training "$work/fresh_again.log" \
    "error: --ckpt $work/full already holds checkpoints (the newest step 30): add --resume" \
    "a new run into a root with checkpoints" --ckpt "$work/full" --steps 40 --save-every 10
  # A --ckpt it cannot write (under a file): not found at the first save.
  touch "$work/afile"
  refused_before_training "$work/unwritable.log" "error: cannot save into --ckpt $work/afile/sub: " \
    "an unwritable --ckpt" --ckpt "$work/afile/sub" --steps 4 --save-every 2
  # Someone's files in the folder of a step the run will save: not found when step 4 is reached.
  mkdir -p "$work/inway/step-000000004" && echo "eval notes" > "$work/inway/step-000000004/notes.txt"
  refused_before_training "$work/inway.log" \
    "error: cannot save into --ckpt $work/inway: .*step-000000004 has no manifest but holds notes.txt.*in the way of step 4's save" \
    "a run whose later save folder holds someone's files" --ckpt "$work/inway" --steps 6 --save-every 2
  # Preemption: a stop signal to the launcher (mpirun.sh forwards it to every rank as SIGUSR1),
  # or to one torchrun worker alone: every rank stops after the same step, saves it, exits 0,
  # and a resume from it continues with the uninterrupted losses.
  bash "$launch/train_fsdp2.sh" "$flag" "$np_save" --ckpt "$work/stop" --steps 100000 --save-every 100000 \
    > "$work/stop.log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do grep -q "^step 3 " "$work/stop.log" && break; sleep 0.1; done
  if [ "$launcher" = mpirun ]; then
    kill -TERM "$pid"
  else
    kill -USR1 "$(pgrep -P "$pid" | head -1)"  # one worker of torchrun's
  fi
  set +e
  wait "$pid"
  rc=$?
  set -e
  stop=$(sed -n 's/^stop requested (SIG[A-Z0-9]* on rank [0-9]*, .* s ago): final checkpoint of step \([0-9]*\)$/\1/p' "$work/stop.log")
  [ $rc = 0 ] && [ -n "$stop" ] && grep -q "^checkpoint step $stop committed" "$work/stop.log" &&
    [ "$(cat "$work/stop/latest")" = "$(printf 'step-%09d' "$stop")" ] && [ "$stop" -lt 28 ] || {
    echo "stopped by a signal: exit $rc, stop step '${stop}'"; tail -20 "$work/stop.log"; exit 1; }
  run "$work/after_stop.log" "$np_save" --ckpt "$work/stop" --steps $((stop + 2)) --save-every 100 --resume
  "$py" "$here/compare_losses.py" "$work/full.log" "$work/after_stop.log" --steps "$((stop + 1))-$((stop + 2))" --exact
fi
