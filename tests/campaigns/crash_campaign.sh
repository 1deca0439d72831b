#!/usr/bin/env bash
# Crash campaign: a 3-rank save runs again and again with one injection each.
#   - First, rank 0 is SIGKILLed at every commit step in turn (commit steps run once, on rank 0,
#     so the injection aims at rank 0 and the first hit).
#   - Then TRIALS random injections: a SIGKILL of a random rank at one of its first writes, or an
#     I/O error (EIO or ENOSPC) at a data write, a data fsync or a commit step.
# Every injection is counted as fired only when the failpoint reports firing
# (SHARDCKPT_FAILPOINTS_FIRED); the campaign fails when fewer than 90% fired.
# After every trial:
#   - `shardckpt verify` passes on the root;
#   - a 3-rank load of the root (a resumed run) succeeds, every byte checked, with a step never
#     older than the last save that reported success: nothing lost;
#   - the resumed run's next save (the loaded step + 1) succeeds with no manual step, whether the
#     root resolved to a checkpoint whose `latest` was never replaced or to the one before it.
# Prints trials, injected, fired, and failures of each kind.
#   bash crash_campaign.sh CHECK_BINARY CLI_BINARY WORKDIR [TRIALS] [SEED]
set -uo pipefail
check=$1; cli=$2; work=$3; trials=${4:-50}; RANDOM=${5:-7}
rm -rf "$work"; mkdir -p "$work"
root="$work/root"
run() { mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np 3 "$@"; }
commit_points=(commit.manifest.write commit.manifest.fsync commit.sync_tmp commit.rename_dir
               commit.sync_root commit.latest.write commit.latest.fsync commit.latest.rename
               commit.latest.sync_dir)
data_points=(io.write io.fsync save.write_data)

run "$check" save "$root" --step 1 --staging-bytes 65536 > /dev/null || { echo "first save failed"; exit 1; }
succeeded=1; top=1; kills=0; errors=0; injected=0; fired=0; lost=0; stuck=0; trial=0

# The newest step folder holding a manifest: what "committed" means on disk.
newest_committed() {
  local newest=0 d s
  for d in "$root"/step-*/; do
    d=${d%/}
    [[ $d =~ /step-([0-9]+)$ ]] || continue
    [ -f "$d/manifest.json" ] || continue
    s=$((10#${BASH_REMATCH[1]}))
    [ $s -gt $newest ] && newest=$s
  done
  echo $newest
}

one_trial() {  # one_trial SPEC KIND
  local spec=$1 kind=$2 step
  trial=$((trial + 1)); injected=$((injected + 1))
  step=$((top + 1))  # above every step folder, committed or not
  [ "$kind" = kill ] && kills=$((kills + 1)) || errors=$((errors + 1))
  rm -f "$work/fired"
  if run -x SHARDCKPT_FAILPOINTS="$spec" -x SHARDCKPT_FAILPOINTS_FIRED="$work/fired" \
       "$check" save "$root" --step "$step" --staging-bytes 65536 > "$work/trial.log" 2>&1; then
    succeeded=$step
  fi
  top=$step
  if [ -s "$work/fired" ]; then
    fired=$((fired + 1))
  else
    echo "trial $trial ($spec): the injection never fired"
  fi
  local resumed
  run "$check" load "$root" > "$work/load.log" 2>&1
  resumed=$(sed -nE 's/^rank 0\/3: OK loaded step ([0-9]+) .*/\1/p' "$work/load.log")
  if ! "$cli" verify "$root" > "$work/verify.log" 2>&1 || [ -z "$resumed" ] || [ "$resumed" -lt "$succeeded" ]; then
    lost=$((lost + 1))
    echo "trial $trial ($spec): the root loads step '${resumed}' (last success $succeeded," \
         "newest committed folder $(newest_committed), latest=$(cat "$root/latest" 2>/dev/null))"
    cat "$work/verify.log" "$work/load.log" | grep -E "FAIL|rror" | head -3
  fi
  # A resumed run continues from the step the root loads and saves the next one: the step that
  # was being saved when the root resolves to the one before it.
  resumed=${resumed:-$(newest_committed)}
  if run "$check" save "$root" --step $((resumed + 1)) --staging-bytes 65536 > "$work/resume.log" 2>&1; then
    succeeded=$((resumed + 1))
    top=$(( succeeded > top ? succeeded : top ))
  else
    stuck=$((stuck + 1))
    echo "trial $trial ($spec): after resuming from step $resumed, the save of step $((resumed + 1)) failed:"
    grep FAIL "$work/resume.log" | head -1
  fi
}

for point in "${commit_points[@]}"; do
  one_trial "$point@0#1=kill" kill
done
for _ in $(seq 1 "$trials"); do
  if [ $((RANDOM % 2)) -eq 0 ]; then
    # A rank writes about a dozen 64 KiB extents: the first 8 hits all happen.
    one_trial "io.write@$((RANDOM % 3))#$((1 + RANDOM % 8))=kill" kill
  else
    errs=(EIO ENOSPC); err=${errs[$((RANDOM % 2))]}
    if [ $((RANDOM % 2)) -eq 0 ]; then
      one_trial "${commit_points[$((RANDOM % ${#commit_points[@]}))]}@0#1=$err" error
    else
      point=${data_points[$((RANDOM % ${#data_points[@]}))]}
      nth=1; [ "$point" = io.write ] && nth=$((1 + RANDOM % 8))  # io.fsync and save.write_data hit once a rank
      one_trial "$point@$((RANDOM % 3))#$nth=$err" error
    fi
  fi
done
echo "crash campaign: $trial trials ($kills kills, $errors errors): $injected injected, $fired fired," \
     "$lost checkpoints lost or not resolved, $stuck resumed runs that could not save"
ok=1
[ $((fired * 10)) -ge $((injected * 9)) ] || { echo "FAIL: only $fired of $injected injections fired"; ok=0; }
[ $lost -eq 0 ] && [ $stuck -eq 0 ] || ok=0
[ $ok -eq 1 ]
