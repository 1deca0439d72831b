#!/usr/bin/env bash
# Agreement campaign: no rank hangs on an error path. For every failpoint of the save, load and
# async-save paths and for every rank in turn, a 3-rank job with a short collective deadline
# injects EIO at that failpoint on that rank. Asserts:
#   - every rank returns, and all three return the same Status (OK when the failpoint never
#     fired on that rank, an error naming the injection when it did);
#   - well before the deadline: no DeadlineExceeded, and the job ends in under half of it;
#   - nothing is lost: after the failure each rank loads the root (failpoints cleared) and gets
#     the new step after a success, the previous one after a failure, every byte checked.
# Prints trials, injections that fired, and failures.
#   bash agreement_campaign.sh CHECK_BINARY WORKDIR [DEADLINE_S] [OPS]
set -uo pipefail
check=$1; work=$2; deadline=${3:-20}; ops=${4:-"save load async"}
rm -rf "$work"; mkdir -p "$work"
root="$work/root"
# Replicated entries read once and broadcast (not every rank reading, the default on one host),
# so load.replicate's broadcasts are on the error paths tried.
run() { mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np 3 -x SHARDCKPT_REPLICATED_READS=broadcast "$@"; }

save_points=(fs.mkdir save.decode_plan save.write_data io.write io.fsync commit.manifest.write
             commit.manifest.fsync commit.sync_tmp commit.rename_dir commit.sync_root commit.latest.write
             commit.latest.fsync commit.latest.rename commit.latest.sync_dir)
load_points=(load.read_manifest load.decode_manifest io.read load.replicate)
# The async path: its own snapshot, then the save's points in the background persist.
async_points=(async.snapshot "${save_points[@]}")

run "$check" outcome "$root" --op save --step 1 --tiny 1 > "$work/first.log" 2>&1 || { cat "$work/first.log"; echo "first save failed"; exit 1; }
committed=1; step=1; trials=0; fired=0; failures=0
fail() { failures=$((failures + 1)); echo "FAIL $1 ($spec): $2"; sed 's/^/    /' "$work/trial.log" | tail -20; }

for op in $ops; do
  case $op in
    save) points=("${save_points[@]}") ;;
    load) points=("${load_points[@]}") ;;
    async) points=("${async_points[@]}") ;;
    *) echo "unknown op $op"; exit 2 ;;
  esac
  for point in "${points[@]}"; do
    for rank in 0 1 2; do
      trials=$((trials + 1))
      [ "$op" = load ] || step=$((step + 1))
      spec="$point@$rank=EIO"
      rm -f "$work/fired"
      start=$(date +%s.%N)
      run -x SHARDCKPT_FAILPOINTS="$spec" -x SHARDCKPT_FAILPOINTS_FIRED="$work/fired" \
          -x SHARDCKPT_COLLECTIVE_TIMEOUT_S="$deadline" \
          "$check" outcome "$root" --op "$op" --step "$step" --tiny 1 > "$work/trial.log" 2>&1
      status=$?
      elapsed=$(echo "$(date +%s.%N) - $start" | bc)
      name="$op $point on rank $rank"
      outcomes=$(grep -E '^rank [0-9]+ outcome: ' "$work/trial.log" | sed -E 's/^rank [0-9]+ outcome: //')
      count=$(grep -cE '^rank [0-9]+ outcome: ' "$work/trial.log")
      distinct=$(printf '%s\n' "$outcomes" | sort -u | grep -c .)
      did_fire=0; [ -s "$work/fired" ] && { did_fire=1; fired=$((fired + 1)); }
      if grep -q DeadlineExceeded "$work/trial.log"; then fail "$name" "a rank waited for the deadline"; continue; fi
      if [ "$(echo "$elapsed > $deadline / 2" | bc)" = 1 ]; then fail "$name" "took ${elapsed}s (deadline ${deadline}s)"; continue; fi
      if [ "$count" -ne 3 ]; then fail "$name" "$count of 3 ranks returned"; continue; fi
      if [ "$distinct" -ne 1 ]; then fail "$name" "ranks returned different results"; continue; fi
      outcome=$(printf '%s\n' "$outcomes" | head -1)
      if [ $did_fire = 1 ]; then
        case "$outcome" in
          # After `latest` names the step the save has succeeded; a later failure may be a warning.
          OK) [ "$point" = commit.latest.sync_dir ] ||
                { fail "$name" "the failpoint fired but the operation succeeded"; continue; } ;;
          *"injected at failpoint $point"*) ;;
          *) fail "$name" "the error does not name the injection: $outcome"; continue ;;
        esac
      elif [ "$outcome" != OK ]; then
        fail "$name" "failed although nothing was injected: $outcome"; continue
      fi
      [ $status -eq 0 ] || { fail "$name" "the load after it failed (exit $status)"; continue; }
      after=$(grep -E '^rank [0-9]+ after: step ' "$work/trial.log" | sed -E 's/.*step //' | sort -u)
      if [ "$op" != load ] && [ "$outcome" = OK ]; then expected=$step; else expected=$committed; fi
      # A save that failed after `latest` named its step may keep it (the step is committed).
      if [ "$after" != "$expected" ] && ! { [ "$outcome" != OK ] && [ "$after" = "$step" ] && [ "$op" != load ]; }; then
        fail "$name" "root loads step '$after', expected $expected"; continue
      fi
      committed=$after
      echo "ok $name: fired=$did_fire ${elapsed}s: $outcome" | cut -c1-200
    done
  done
done
echo "agreement campaign: $trials trials, $fired injections fired, $failures failures (deadline ${deadline}s)"
[ $failures -eq 0 ] && [ $fired -gt 0 ]
