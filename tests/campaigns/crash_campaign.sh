#!/usr/bin/env bash
# Crash campaign: a 3-rank save runs again and again; each trial either SIGKILLs a random rank at
# a random moment of its writes, or injects an I/O error (EIO or ENOSPC) at a random I/O call or
# commit step. After every trial `shardckpt verify` passes on `latest` and a 3-rank load of it
# succeeds with the step of the last save that reported success. Prints trials, kills, failures
# injected and checkpoints lost (must be 0).
#   bash crash_campaign.sh CHECK_BINARY CLI_BINARY WORKDIR [TRIALS] [SEED]
set -uo pipefail
check=$1; cli=$2; work=$3; trials=${4:-50}; RANDOM=${5:-7}
rm -rf "$work"; mkdir -p "$work"
run() { mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np 3 "$@"; }
points=(io.write io.fsync save.write_data commit.sync_tmp commit.manifest.write commit.manifest.fsync
        commit.manifest.rename commit.rename_dir commit.sync_root commit.latest.write commit.latest.rename)
run "$check" save "$work/root" --step 1 --staging-bytes 65536 > /dev/null || { echo "first save failed"; exit 1; }
committed=1; step=1; kills=0; injected=0; lost=0; clean=0
for t in $(seq 1 "$trials"); do
  step=$((step + 1))
  rank=$((RANDOM % 3))
  if [ $((RANDOM % 2)) -eq 0 ]; then
    spec="io.write@${rank}#$((1 + RANDOM % 12))=kill"; kills=$((kills + 1))
  else
    errs=(EIO ENOSPC); spec="${points[$((RANDOM % ${#points[@]}))]}@${rank}#$((1 + RANDOM % 3))=${errs[$((RANDOM % 2))]}"
    injected=$((injected + 1))
  fi
  if run -x SHARDCKPT_FAILPOINTS="$spec" "$check" save "$work/root" --step "$step" --staging-bytes 65536 > "$work/trial.log" 2>&1; then
    committed=$step; clean=$((clean + 1))  # the failpoint never fired (e.g. fewer writes than N)
  fi
  latest=$(cat "$work/root/latest")
  if ! "$cli" verify "$work/root" > "$work/verify.log" 2>&1 || \
     ! run "$check" load "$work/root" --expect-step "$committed" > "$work/load.log" 2>&1; then
    lost=$((lost + 1))
    echo "trial $t ($spec): checkpoint lost or damaged; latest=$latest committed=$committed"
    cat "$work/verify.log" "$work/load.log" | tail -5
  fi
done
echo "crash campaign: $trials trials, $kills kills, $injected failures injected, $clean saves unharmed, $lost checkpoints lost"
[ $lost -eq 0 ]
