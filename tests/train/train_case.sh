#!/usr/bin/env bash
# The demo trainer's promises, run by CTest: bash train_case.sh TRAIN_BINARY WORKDIR CASE
#   exact-resume   steps 21-30 after resuming from step 20 print exactly the uninterrupted losses;
#                  --resume-weights-only does not
#   reshard N M    a run saved at N ranks resumed at M follows the uninterrupted N-rank run within
#                  a relative 1e-5 (only the order of floating-point reductions differs)
#   killed         a rank SIGKILLed while writing the step-20 checkpoint; --resume restarts from
#                  step 10 and the run completes with the uninterrupted losses
#   keep-best CLI  saves at steps 10..60 with --keep-last 1 --keep-best 2 end with exactly the
#                  newest checkpoint and the two with the lowest recorded loss; `list`, `inspect`
#                  show the loss; `prune --dry-run` removes nothing, nor does `prune` by a metric no
#                  checkpoint records or of a checkpoint folder; a SIGKILLed `prune` leaves
#                  folders complete or without a manifest; `prune` applies its rule
#   commit-window  rank 0 killed after renaming step-000000020 but before replacing `latest`:
#                  --resume continues from step 20 with no manual step, and the run completes with
#                  the uninterrupted losses and `latest` repaired
#   device         --device cuda: with a CUDA libtorch and GPUs, a device-resident run resumes
#                  exactly from a device checkpoint; without, every rank refuses with the reason
set -euo pipefail
train=$1; work=$2; case=$3; shift 3
rm -rf "$work"; mkdir -p "$work"
run() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np "$np" "$@"; }
losses() { grep -E '^step [0-9]+ loss' "$1" | awk -v lo="$2" -v hi="$3" '$2 >= lo && $2 <= hi'; }
small=(--hidden 256)

case "$case" in
  exact-resume)
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 20 --save-every 10 > "$work/first.log"
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 30 --resume > "$work/resumed.log"
    grep -q "resumed from .*step-000000020 at step 20" "$work/resumed.log"
    diff <(losses "$work/full.log" 21 30) <(losses "$work/resumed.log" 21 30)
    [ "$(losses "$work/resumed.log" 21 30 | wc -l)" -eq 10 ]
    run 2 "$train" "${small[@]}" --ckpt "$work/w" --steps 20 --save-every 20 > /dev/null
    run 2 "$train" "${small[@]}" --ckpt "$work/w" --steps 30 --resume-weights-only > "$work/weights.log"
    grep -q "resumed weights only" "$work/weights.log"
    [ "$(losses "$work/weights.log" 21 30 | wc -l)" -eq 10 ]
    if diff -q <(losses "$work/full.log" 21 30) <(losses "$work/weights.log" 21 30) > /dev/null; then
      echo "weights-only resume matched the full run: optimizer state would not matter"; exit 1
    fi ;;
  async)  # --async-save: the same losses, the same checkpoints, exact resume from one
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 20 --save-every 10 --async-save > "$work/first.log"
    grep -q "checkpoint snapshot: step 20" "$work/first.log"
    grep -q "checkpoint committed: step 20 (async)" "$work/first.log"
    diff <(losses "$work/full.log" 1 20) <(losses "$work/first.log" 1 20)
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 30 --resume --async-save > "$work/resumed.log"
    diff <(losses "$work/full.log" 21 30) <(losses "$work/resumed.log" 21 30) ;;
  reshard)
    n=$1; m=$2
    run "$n" "$train" "${small[@]}" --steps 30 > "$work/full.log"
    run "$n" "$train" "${small[@]}" --ckpt "$work/r" --steps 20 --save-every 20 > /dev/null
    run "$m" "$train" "${small[@]}" --ckpt "$work/r" --steps 30 --resume > "$work/resumed.log"
    grep -q "saved by $n ranks" "$work/resumed.log"
    paste <(losses "$work/full.log" 21 30) <(losses "$work/resumed.log" 21 30) | awk '
      NF != 8 { print "missing steps"; bad = 1; next }
      { d = $4 - $8; if (d < 0) d = -d; r = d / ($4 < 0 ? -$4 : $4); if (r > max) max = r; if (r > 1e-5) bad = 1 }
      END { printf "max relative loss difference %.3g over steps 21-30\n", max; exit bad }' ;;
  killed)
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    set +e
    run 2 -x SHARDCKPT_FAILPOINTS="save.write_data@1#2=kill" "$train" "${small[@]}" --ckpt "$work/k" --steps 30 --save-every 10 > "$work/killed.log" 2>&1
    status=$?
    set -e
    [ $status -ne 0 ] || { echo "the killed run exited 0"; exit 1; }
    test "$(cat "$work/k/latest")" = step-000000010
    run 2 "$train" "${small[@]}" --ckpt "$work/k" --steps 30 --save-every 10 --resume > "$work/resumed.log"
    grep -q "at step 10" "$work/resumed.log"
    diff <(losses "$work/full.log" 11 30) <(losses "$work/resumed.log" 11 30)
    test "$(cat "$work/k/latest")" = step-000000030 ;;
  consolidated)  # the final checkpoint, consolidated, equals the parameters gathered in the job
    cli=$1
    run 3 "$train" "${small[@]}" --ckpt "$work/c" --steps 12 --save-every 6 --dump-params "$work/params.bin" > /dev/null
    "$cli" consolidate "$work/c" --out "$work/model.pt" --include 'model.*'
    /usr/bin/python3 - "$work/model.pt" "$work/params.bin" <<'PY'
import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
raw = open(sys.argv[2], "rb").read()
pos, seen = 0, 0
while pos < len(raw):
    end = raw.index(b"\n", pos)
    name, numel = raw[pos:end].decode().split()
    numel = int(numel)
    data = bytearray(raw[end + 1:end + 1 + 4 * numel])
    pos = end + 1 + 4 * numel
    want = torch.frombuffer(data, dtype=torch.float32)
    assert torch.equal(sd[name].reshape(-1), want), name
    seen += 1
assert seen == len(sd) == 8, (seen, len(sd))
print("consolidated model equals the %d gathered parameters" % seen)
PY
    ;;
  device)
    if run 2 "$train" "${small[@]}" --device cuda --ckpt "$work/d" --steps 12 > "$work/full.log" 2>&1; then
      run 2 "$train" "${small[@]}" --device cuda --ckpt "$work/d" --steps 6 --save-every 6 > /dev/null
      run 2 "$train" "${small[@]}" --device cuda --ckpt "$work/d" --steps 12 --resume > "$work/resumed.log"
      diff <(losses "$work/full.log" 7 12) <(losses "$work/resumed.log" 7 12)
    else
      cat "$work/full.log"
      for r in 0 1; do
        grep -q "rank $r: FailedPrecondition: --device cuda needs a CUDA build of libtorch" "$work/full.log" ||
          grep -q "rank $r: FailedPrecondition: --device cuda needs NCCL" "$work/full.log" ||
          { echo "rank $r did not say why --device cuda cannot run"; exit 1; }
      done
      test ! -e "$work/d/latest" || { echo "a refused run wrote a checkpoint"; exit 1; }
    fi ;;
  keep-best)  # CLI
    cli=$1
    # A small batch makes the loss noisy, so the best two are not the newest (checked below).
    run 2 "$train" "${small[@]}" --global-batch 4 --ckpt "$work/r" --steps 60 --save-every 10 --keep-last 1 \
      --keep-best 2 > "$work/run.log"
    "$cli" list "$work/r" --json --keep-last 1 --keep-best 2 --metric loss > "$work/list.json"
    "$cli" inspect "$work/r" --json > "$work/inspect.json"
    /usr/bin/python3 - "$work/run.log" "$work/list.json" "$work/inspect.json" <<'PY'
import json, sys
losses = {}
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) == 4 and w[0] == "step" and w[2] == "loss" and int(w[1]) % 10 == 0:
        losses[int(w[1])] = float(w[3])
assert sorted(losses) == [10, 20, 30, 40, 50, 60], losses
best = sorted(losses, key=lambda s: (losses[s], -s))[:2]
want = sorted(set(best) | {60})
assert len(want) == 3, f"the newest is among the best two {best}: the case proves nothing"
listed = json.load(open(sys.argv[2]))
rows = listed["checkpoints"]
have = sorted(r["step"] for r in rows if r["committed"])
assert have == want, f"kept {have}, expected newest 60 and the two lowest losses {best}: {want}"
assert all(r["keep"] for r in rows), rows
assert listed["latest"] == "step-000000060", listed["latest"]
for r in rows:
    assert abs(r["metrics"]["loss"] - losses[r["step"]]) <= 1e-6 * abs(losses[r["step"]]), (r, losses)
inspected = json.load(open(sys.argv[3]))
assert inspected["step"] == 60 and abs(inspected["metrics"]["loss"] - losses[60]) <= 1e-6 * abs(losses[60]), inspected
print(f"kept {have}: newest and best 2 of {losses}")
PY
    before=$(ls "$work/r")
    "$cli" prune "$work/r" --keep-last 1 --dry-run > "$work/dry.out"
    cat "$work/dry.out"
    [ "$(ls "$work/r")" = "$before" ] || { echo "prune --dry-run removed something"; exit 1; }
    [ "$(grep -c '^would remove' "$work/dry.out")" -eq "$(( $(echo "$before" | grep -c '^step-') - 1 ))" ]
    # A metric no checkpoint records would make nothing best: refused, naming it, nothing removed.
    if "$cli" prune "$work/r" --keep-last 1 --keep-best 2 --metric val_loss > "$work/typo.out" 2>&1; then
      echo "prune by a metric no checkpoint records succeeded"; exit 1
    fi
    grep -q "records the metric 'val_loss' (recorded: loss)" "$work/typo.out" || { cat "$work/typo.out"; exit 1; }
    [ "$(ls "$work/r")" = "$before" ] || { echo "prune by an unrecorded metric removed something"; exit 1; }
    # A checkpoint folder given for a root: refused, and nothing is written into the checkpoint.
    if "$cli" prune "$work/r/step-000000060" --keep-last 1 > "$work/notroot.out" 2>&1; then exit 1; fi
    grep -q "is a checkpoint, not a root" "$work/notroot.out" || { cat "$work/notroot.out"; exit 1; }
    test ! -e "$work/r/step-000000060/.shardckpt.lock"
    # A prune SIGKILLed after the first manifest is gone: each folder is complete or has no manifest.
    set +e
    SHARDCKPT_FAILPOINTS="retention.remove_tree#1=kill" "$cli" prune "$work/r" --keep-last 1 > /dev/null 2>&1
    status=$?
    set -e
    [ $status -eq 137 ] || { echo "the prune was not killed (exit $status)"; exit 1; }
    for d in "$work"/r/step-*; do
      [ ! -e "$d/manifest.json" ] || "$cli" verify "$d" > /dev/null || { echo "$d looks committed but is not whole"; exit 1; }
    done
    [ "$(ls "$work"/r/step-*/manifest.json | wc -l)" -eq 2 ] || { ls -R "$work/r"; exit 1; }
    "$cli" prune "$work/r" --keep-last 1 > "$work/prune.out"
    [ "$(ls "$work/r" | grep '^step-')" = step-000000060 ] || { ls "$work/r"; exit 1; }
    "$cli" verify "$work/r" > /dev/null ;;
  commit-window)
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    set +e
    run 2 -x SHARDCKPT_FAILPOINTS="commit.latest.write@0#2=kill" "$train" "${small[@]}" --ckpt "$work/k" --steps 30 \
      --save-every 10 > "$work/killed.log" 2>&1
    status=$?
    set -e
    [ $status -ne 0 ] || { echo "the killed run exited 0"; exit 1; }
    # The window: step 20 is committed, `latest` still names step 10.
    test "$(cat "$work/k/latest")" = step-000000010
    test -f "$work/k/step-000000020/manifest.json"
    run 2 "$train" "${small[@]}" --ckpt "$work/k" --steps 30 --save-every 10 --resume > "$work/resumed.log"
    grep -q "resumed from .*step-000000020 at step 20" "$work/resumed.log"
    diff <(losses "$work/full.log" 21 30) <(losses "$work/resumed.log" 21 30)
    test "$(cat "$work/k/latest")" = step-000000030 ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
echo "train case $case $*: passed"
