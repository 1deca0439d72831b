#!/usr/bin/env bash
# The demo trainer's promises, run by CTest: bash train_case.sh TRAIN_BINARY WORKDIR CASE
#   bad-flags      every flag out of range exits 2 on every rank naming it, before training
#   exact-resume   steps 21-30 after resuming from step 20 print exactly the uninterrupted losses;
#                  --resume-weights-only does not
#   reshard N M    a run saved at N ranks resumed at M follows the uninterrupted N-rank run within
#                  a relative 1e-5 (only the order of floating-point reductions differs)
#   killed         a rank SIGKILLed while writing the step-20 checkpoint; --resume restarts from
#                  step 10 and the run completes with the uninterrupted losses
#   dcp-export CLI a checkpoint exported to a DCP folder resumes at another world size (the
#                  trainer's blobs are byte items there; the per-rank RNG is reseeded)
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
#   preempt HOW CLI  SIGTERM in the middle of a run with async saves, sent to launch/mpirun.sh
#                  (HOW=mpirun), to its whole process group (HOW=group: `timeout`, Slurm) or to
#                  rank 1 alone (HOW=rank): every rank stops after the same step,
#                  a final checkpoint of that step commits and verifies, exit 0, and --resume
#                  continues with exactly the losses of an uninterrupted run
#   preempt-short-grace CLI  a grace period too short for a save: no save is started, exit 75,
#                  the log names the previous checkpoint, which is `latest`, verifies and resumes
#   rank-fails     rank 1 alone cannot gather its state (failpoint train.state): at --resume, in a
#                  synchronous and in an async save, every rank fails at once naming rank 1's error,
#                  none waits for the collective deadline
#   resume-agrees  rank 1's --ckpt shows no checkpoint where rank 0's shows step 10 (a stale view of
#                  a network filesystem): every rank resumes from step 10, none starts training alone
#   preempt-save-fails CLI  the final save fails on one rank: every rank exits 1 and the log names
#                  the checkpoint to resume from, which is intact
#   preempt-pipe CLI  `launch/mpirun.sh ... | tee LOG` and a SIGTERM to the whole process group,
#                  tee included: the ranks still stop, save their step (latest) and end
#   preempt-startup  SIGTERM to every rank while MPI starts (the moment MPI_Init installs its own
#                  handlers): every rank stops after the same step (the first), which is saved, exit 0
#   launcher-tstp  SIGTSTP to launch/mpirun.sh's process group pauses the ranks; SIGCONT resumes them
#   log-follow     progress lines reach a pipe and a file as they happen, not at exit; launch/mpirun.sh
#                  reads --np=N, -n=N and -c N
#   slurm-requeue  launch/slurm.sbatch with srun and scontrol stubbed: SIGUSR1 to the batch shell
#                  (what --signal=B:USR1@180 sends) stops the ranks with a final checkpoint, the
#                  script requeues the job, and the next attempt resumes to the uninterrupted losses
set -euo pipefail
train=$1; work=$2; case=$3; shift 3
rm -rf "$work"; mkdir -p "$work"
run() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np "$np" "$@"; }
losses() { grep -E '^step [0-9]+ loss' "$1" | awk -v lo="$2" -v hi="$3" '$2 >= lo && $2 <= hi'; }
small=(--hidden 256)
launcher=$(cd "$(dirname "$0")/../../launch" && pwd)/mpirun.sh
pace="train.step=sleep:100"  # 100 ms steps, so a signal lands in the middle of a run
wait_for() {  # FILE REGEX: until a line of FILE matches (two minutes at most)
  for _ in $(seq 2400); do grep -qE "$2" "$1" 2> /dev/null && return 0; sleep 0.05; done
  echo "timed out waiting for /$2/ in $1:"; cat "$1"; exit 1
}
env_has() { tr '\0' '\n' 2> /dev/null < "/proc/$1/environ" | grep -qxF "$2"; }
rank_pid() {  # RANK TAG: the pid of that rank of the job started with -x PREEMPT_TEST_TAG=TAG
  local p
  for p in $(pgrep -x shardckpt-train); do
    if env_has "$p" "OMPI_COMM_WORLD_RANK=$1" && env_has "$p" "PREEMPT_TEST_TAG=$2"; then echo "$p"; return; fi
  done
  echo "no process of rank $1 tagged $2" >&2
}
stopped_job() {  # TARGET COMMAND...: runs COMMAND into $work/stopped.log and, once step 12 is logged,
  # sends SIGTERM to TARGET (launcher: COMMAND's process; group: every process of COMMAND's
  # process group, then SIGCONT, as `timeout` does; rank1: that rank alone); sets $status
  if [ "$1" = group ]; then setsid "${@:2}" > "$work/stopped.log" 2>&1 & else "${@:2}" > "$work/stopped.log" 2>&1 & fi
  local job=$!  # setsid execs (a background child leads no group): the group's id
  wait_for "$work/stopped.log" '^step 12 loss'
  case "$1" in
    launcher) kill -TERM "$job" ;;
    # As coreutils `timeout` sends them: SIGTERM to the command and its group, then at once
    # SIGCONT to both (in case the job was stopped).
    group) kill -TERM "$job"; kill -TERM -- "-$job"; kill -CONT "$job"; kill -CONT -- "-$job" ;;
    *) kill -TERM "$(rank_pid 1 "$work")" ;;
  esac
  ended "$job" "$work/stopped.log"
  # The launcher returns when its ranks have ended, not before.
  local p
  for p in $(pgrep -x shardckpt-train); do
    if env_has "$p" "PREEMPT_TEST_TAG=$work"; then echo "rank process $p still runs after the job returned"; exit 1; fi
  done
}
ended() {  # JOB LOG: waits for JOB, sets $status to its exit status, shows LOG
  set +e
  wait "$1"
  status=$?
  set -e
  cat "$2"
}
stop_step() {  # NP LOG: the step after which every one of NP ranks said it stopped
  local said steps
  said=$(grep -cE '^rank [0-9]+: stopping after step [0-9]+' "$2" || true)
  steps=$(grep -oE '^rank [0-9]+: stopping after step [0-9]+' "$2" | awk '{print $6}' | sort -u)
  [ "$said" -eq "$1" ] && [ "$(echo "$steps" | wc -l)" -eq 1 ] ||
    { echo "ranks did not stop at one step (expected $1 ranks):"; grep 'stopping after' "$2"; exit 1; }
  echo "$steps"
}

case "$case" in
  bad-flags)  # every flag out of range: exit 2 on every rank with the flag named, before training
    touch "$work/afile"
    while IFS='|' read -r flags message; do
      set +e; run 2 "$train" "${small[@]}" $flags > "$work/bad.log" 2>&1; rc=$?; set -e
      [ $rc = 2 ] && [ "$(grep -c "^shardckpt-train: $message" "$work/bad.log")" = 2 ] && ! grep -q '^step ' "$work/bad.log" ||
        { echo "flags '$flags': exit $rc, expected 2 and '$message' from both ranks:"; cat "$work/bad.log"; exit 1; }
    done <<EOF2
--dropout 1.5|--dropout must be a probability in \[0, 1), not 1.5$
--dropout -0.1|--dropout must be a probability
--hidden -3|--hidden must be at least 1, not -3
--hidden 0|--hidden must be at least 1, not 0
--global-batch 0|--global-batch must be at least 1, not 0
--steps -1|--steps must be at least 0, not -1
--save-every -1|--save-every must be at least 0, not -1
--keep-last -1|--keep-last must be at least 0, not -1
--keep-best -2|--keep-best must be at least 0, not -2
--ckpt $work/afile|--ckpt $work/afile is a file, not a folder to save checkpoints in
--copy-while-training|--copy-while-training needs --async-save
--preempt-grace-s -1|--preempt-grace-s must be seconds >= 0
EOF2
    # An empty --ckpt (an unset variable in a batch script): refused, not a run that saves nothing.
    set +e; run 2 "$train" "${small[@]}" --ckpt "" --steps 4 --save-every 2 > "$work/bad.log" 2>&1; rc=$?; set -e
    [ $rc = 2 ] && [ "$(grep -c "^shardckpt-train: --ckpt is empty (an unset variable?)" "$work/bad.log")" = 2 ] ||
      { echo "--ckpt '': exit $rc"; cat "$work/bad.log"; exit 1; }
    run 1 "$train" --help | grep -qE -- '--dropout arg \(=0\.1\)' ;;
  exact-resume)
    cli=$1
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 20 --save-every 10 > "$work/first.log"
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 30 --resume > "$work/resumed.log"
    grep -q "resumed from .*step-000000020 at step 20" "$work/resumed.log"
    diff <(losses "$work/full.log" 21 30) <(losses "$work/resumed.log" 21 30)
    # Without --save-every the resumed run saved nothing, and said so.
    grep -q "^note: --save-every is 0: this run saves no periodic checkpoint into --ckpt $work/a (only a final one if it is preempted" "$work/resumed.log"
    ! grep -q "^note: --save-every" "$work/first.log"
    # Resumed at or past --steps: says so rather than exiting silently.
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 20 --resume > "$work/nothing.log"
    grep -q "^nothing to train: the run is at step 20 and --steps is 20" "$work/nothing.log"
    # A resume whose reads fail (EIO: a broken mount; EACCES reads the same) gets the advice a
    # damaged checkpoint gets, once, with what to fix first.
    set +e; run 2 -x SHARDCKPT_FAILPOINTS="io.read=EIO" "$train" "${small[@]}" --ckpt "$work/a" --steps 30 --resume \
      > "$work/eio.log" 2>&1; rc=$?; set -e
    [ $rc = 1 ] && [ "$(grep -c "resume failed: IoError: .*rank-0000.\.bin" "$work/eio.log")" = 2 ] &&
      [ "$(grep -c "^its files cannot be read (a permission, a broken mount?): fix that; or, to resume from an earlier checkpoint: --resume-from $work/a/step-NNNNNNNNN" "$work/eio.log")" = 1 ] ||
      { echo "a resume whose reads fail: exit $rc"; cat "$work/eio.log"; exit 1; }
    # A newer step folder whose manifest was deleted: readers use the older one and say why.
    cp -a "$work/a" "$work/nomanifest" && rm "$work/nomanifest/step-000000020/manifest.json"
    "$cli" inspect "$work/nomanifest" > "$work/inspect.out" 2> "$work/inspect.err"
    grep -q "^checkpoint  $work/nomanifest/step-000000010" "$work/inspect.out" &&
      grep -q "$work/nomanifest/step-000000020, newer than step-000000010, has no manifest.json (deleted, a copy that stopped short, or a save removing its own failed commit)" "$work/inspect.err" ||
      { echo "a newer step folder without its manifest"; cat "$work/inspect.out" "$work/inspect.err"; exit 1; }
    # A folder named latest (someone's mkdir): list says saves refuse the root, prune --dry-run
    # refuses as prune does, and --resume is refused before training, not at its first save.
    cp -a "$work/a" "$work/dirlatest" && rm "$work/dirlatest/latest" && mkdir "$work/dirlatest/latest"
    "$cli" list "$work/dirlatest" > /dev/null 2> "$work/list.err"
    grep -q "^note: $work/dirlatest/latest is a folder, .*saves and prune refuse the root until then" "$work/list.err" &&
      ! grep -q "mends it" "$work/list.err" || { echo "list of a root with a latest folder"; cat "$work/list.err"; exit 1; }
    set +e; "$cli" prune "$work/dirlatest" --keep-last 1 --dry-run > "$work/prune.out" 2>&1; rc=$?; set -e
    [ $rc = 1 ] && grep -q "latest is a folder" "$work/prune.out" && ! grep -q "would remove" "$work/prune.out" ||
      { echo "prune --dry-run with a latest folder: exit $rc"; cat "$work/prune.out"; exit 1; }
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/dirlatest" --steps 30 --save-every 10 --resume > "$work/dirlatest.log" 2>&1
    rc=$?; set -e
    [ $rc = 1 ] && grep -q "cannot save into --ckpt $work/dirlatest: .*$work/dirlatest/latest is a folder" "$work/dirlatest.log" &&
      ! grep -q '^step ' "$work/dirlatest.log" ||
      { echo "a resume into a root with a latest folder: exit $rc"; cat "$work/dirlatest.log"; exit 1; }
    # Someone's files in the folder of a step the run will save (step 20): refused before
    # training, not when step 20 is reached (every rank died there, the steps since 10 lost).
    mkdir -p "$work/inway/step-000000020" && echo "eval notes" > "$work/inway/step-000000020/notes.txt"
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/inway" --steps 30 --save-every 10 > "$work/inway.log" 2>&1
    rc=$?; set -e
    [ $rc = 1 ] && grep -q "cannot save into --ckpt $work/inway: .*step-000000020 has no manifest but holds notes.txt.*in the way of step 20's save" "$work/inway.log" &&
      ! grep -q '^step ' "$work/inway.log" && [ ! -e "$work/inway/step-000000010" ] ||
      { echo "a run whose later save folder holds someone's files: exit $rc"; cat "$work/inway.log"; exit 1; }
    # --resume-from a checkpoint folder of another root: the same losses, saves go to --ckpt.
    run 2 "$train" "${small[@]}" --ckpt "$work/from" --steps 30 --save-every 30 --resume-from "$work/a/step-000000020" \
      > "$work/from.log"
    grep -q "resumed from $work/a/step-000000020 at step 20" "$work/from.log"
    diff <(losses "$work/full.log" 21 30) <(losses "$work/from.log" 21 30)
    test -f "$work/from/step-000000030/manifest.json"
    # --resume-from an earlier step of the root it saves into (which holds step 20): refused by
    # every rank before training, not at its first save.
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 30 --save-every 10 \
      --resume-from "$work/a/step-000000010" > "$work/back.log" 2>&1; rc=$?; set -e
    [ $rc = 1 ] && [ "$(grep -c "is earlier than step-000000020, the newest checkpoint in $work/a" "$work/back.log")" = 2 ] &&
      grep -q -- "with --resume-from OLD, pass --ckpt NEW_ROOT" "$work/back.log" && ! grep -q '^step ' "$work/back.log" ||
      { echo "resume-from an earlier step into its own root: exit $rc"; cat "$work/back.log"; exit 1; }
    # A newer step folder linked from an archive that is not mounted: a new run is still refused
    # (the root holds checkpoints), and --resume fails naming the link instead of going back.
    cp -a "$work/a" "$work/linked" && rm -f "$work/linked/latest"
    ln -s "$work/archive-gone/step-000000040" "$work/linked/step-000000040"
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/linked" --steps 30 --save-every 10 > "$work/linked.log" 2>&1
    rc=$?; set -e
    [ $rc = 1 ] && grep -q "already holds checkpoints" "$work/linked.log" && ! grep -q '^step ' "$work/linked.log" ||
      { echo "a new run into a root with an unreachable step folder: exit $rc"; cat "$work/linked.log"; exit 1; }
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/linked" --steps 50 --save-every 10 --resume > "$work/linked.log" 2>&1
    rc=$?; set -e
    [ $rc = 1 ] && grep -q "step-000000040, newer than step-000000020, is a link to $work/archive-gone/step-000000040" \
      "$work/linked.log" && ! grep -q '^step ' "$work/linked.log" && [ -L "$work/linked/step-000000040" ] ||
      { echo "a resume with an unreachable newer step folder: exit $rc"; cat "$work/linked.log"; exit 1; }
    # list says so: the state of the link, and that readers refuse the root rather than use latest.
    "$cli" list "$work/linked" > "$work/list.out" 2> "$work/list.err"
    grep -q "^step-000000040@ .* unreachable " "$work/list.out" &&
      grep -q "^note: $work/linked/step-000000040, newer than every committed checkpoint, is a link to $work/archive-gone/step-000000040, which cannot be reached (No such file or directory): loading the root is refused" "$work/list.err" &&
      ! grep -q "readers use" "$work/list.err" ||
      { echo "list of a root whose newest step folder cannot be reached"; cat "$work/list.out" "$work/list.err"; exit 1; }
    "$cli" list "$work/linked" --json | python3 -c "import json,sys; j=json.load(sys.stdin); assert j['unreachable_newest'] == 'step-000000040', j; \
states={c['name']: c['state'] for c in j['checkpoints']}; assert states == {'step-000000010': 'committed', 'step-000000020': 'committed', 'step-000000040': 'unreachable'}, states"
    # Its only step folder such a link, no `latest`: a root of someone's checkpoints all the same.
    mkdir -p "$work/onlylink" && ln -s "$work/archive-gone/step-000000040" "$work/onlylink/step-000000040"
    for resume in "" --resume; do
      set +e; run 2 "$train" "${small[@]}" --ckpt "$work/onlylink" --steps 30 --save-every 10 $resume > "$work/linked.log" 2>&1
      rc=$?; set -e
      [ $rc = 1 ] && ! grep -q '^step ' "$work/linked.log" &&
        { grep -q "step-000000040.* is a link to $work/archive-gone/step-000000040" "$work/linked.log" ||
          grep -q "already holds checkpoints" "$work/linked.log"; } ||
        { echo "a run '$resume' into a root whose only step folder cannot be reached: exit $rc"; cat "$work/linked.log"; exit 1; }
    done
    # --ckpt a checkpoint folder, not its root: refused before training, nothing written in it.
    before=$(ls -A "$work/a/step-000000020")
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/a/step-000000020" --steps 30 --save-every 10 --resume \
      > "$work/folder.log" 2>&1; rc=$?; set -e
    [ $rc = 1 ] && [ "$(grep -c "is a checkpoint, not a root" "$work/folder.log")" = 2 ] && ! grep -q '^step ' "$work/folder.log" &&
      [ "$(ls -A "$work/a/step-000000020")" = "$before" ] ||
      { echo "--ckpt a checkpoint folder: exit $rc"; cat "$work/folder.log"; ls -A "$work/a/step-000000020"; exit 1; }
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/a/step-000000020" --steps 30 --save-every 10 \
      > "$work/folder.log" 2>&1; rc=$?; set -e  # not resuming: the same
    [ $rc = 1 ] && [ "$(grep -c "is a checkpoint, not a root" "$work/folder.log")" = 2 ] && ! grep -q '^step ' "$work/folder.log" ||
      { echo "--ckpt a checkpoint folder without --resume: exit $rc"; cat "$work/folder.log"; exit 1; }
    [ "$(losses "$work/resumed.log" 21 30 | wc -l)" -eq 10 ]
    # --resume forgotten: refused by every rank before training (it trained to its first save
    # and failed there, or with a later step mixed a new run into the old root).
    before=$(ls -A "$work/a")
    set +e; run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 40 --save-every 40 > "$work/fresh.log" 2>&1; rc=$?; set -e
    [ $rc = 1 ] && [ "$(grep -c "$work/a already holds checkpoints (the newest step-000000020): add --resume" "$work/fresh.log")" = 2 ] &&
      ! grep -q '^step ' "$work/fresh.log" && [ "$(ls -A "$work/a")" = "$before" ] ||
      { echo "a new run into a root with checkpoints: exit $rc"; cat "$work/fresh.log"; exit 1; }
    # A setting changed on resume is said (the run no longer continues as the saved one would).
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 31 --resume --seed 99 > "$work/seed.log"
    grep -q "^note: seed was 1234 in the checkpoint and is 99 now" "$work/seed.log" ||
      { echo "a changed --seed was not said"; cat "$work/seed.log"; exit 1; }
    ! grep -v "^note: --save-every" "$work/resumed.log" | grep -q "^note: " || { echo "an unchanged resume noted a change"; cat "$work/resumed.log"; exit 1; }
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
  async-overlap)  # --copy-while-training: the step-10 copy starts 300 ms late, so step 11's
    # update must wait for it at the fence; losses and the resume from step 10 are exact all the same
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    run 2 -x SHARDCKPT_FAILPOINTS="async.snapshot=sleep:300" "$train" "${small[@]}" --ckpt "$work/o" --steps 15 \
      --save-every 10 --async-save --copy-while-training > "$work/first.log"
    grep -q "checkpoint copy started: step 10" "$work/first.log"
    grep -Eq "checkpoint snapshot: step 10 \(training blocked 0\.[1-9]" "$work/first.log"
    grep -q "checkpoint committed: step 10 (async)" "$work/first.log"
    diff <(losses "$work/full.log" 1 15) <(losses "$work/first.log" 1 15)
    grep -q "checkpoint committed: step 15 (async)" "$work/first.log"  # the last step, saved too
    run 2 "$train" "${small[@]}" --ckpt "$work/o2" --steps 30 --save-every 10 --resume-from "$work/o/step-000000010" > "$work/resumed.log"
    grep -q "at step 10" "$work/resumed.log"
    diff <(losses "$work/full.log" 11 30) <(losses "$work/resumed.log" 11 30)
    # A requeued job (--resume with --resume-from, as launch/slurm.sbatch passes --resume) goes on
    # from its own newest step once --ckpt holds one, not from --resume-from again.
    run 2 "$train" "${small[@]}" --ckpt "$work/o2" --steps 30 --resume --resume-from "$work/o/step-000000010" \
      > "$work/requeued.log"
    grep -q "^--ckpt $work/o2 holds a checkpoint: resuming from it (--resume), not from --resume-from" "$work/requeued.log"
    grep -q "^nothing to train: the run is at step 30 and --steps is 30" "$work/requeued.log"
    if run 2 "$train" "${small[@]}" --steps 1 --copy-while-training 2> "$work/flag.err"; then exit 1; fi
    grep -q "needs --async-save" "$work/flag.err"
    # A step that fails while the copy of step 2 still runs: the run ends with the step's error
    # (exit 1) and step 2 commits; the copy's state outlived the saver (it was freed first, and
    # the copy read freed memory: std::bad_alloc, terminate, exit 134, nothing committed).
    set +e
    run 2 -x SHARDCKPT_FAILPOINTS="train.step#3=EIO;async.snapshot=sleep:1500" "$train" "${small[@]}" \
      --ckpt "$work/f" --steps 6 --save-every 2 --async-save --copy-while-training > "$work/failed.log" 2>&1
    rc=$?
    set -e
    [ $rc = 1 ] && grep -q "rank 0: IoError: step 3" "$work/failed.log" && ! grep -q "terminate called" "$work/failed.log" ||
      { echo "a step failing during the copy: exit $rc"; cat "$work/failed.log"; exit 1; }
    test "$(cat "$work/f/latest")" = step-000000002 ;;
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
      # Both ranks fail for the same reason, named once for both.
      grep -q "FailedPrecondition: ranks 0-1: --device cuda needs a CUDA build of libtorch" "$work/full.log" ||
        grep -q "FailedPrecondition: ranks 0-1: --device cuda needs NCCL" "$work/full.log" ||
        { echo "the ranks did not say why --device cuda cannot run"; exit 1; }
      test ! -e "$work/d/latest" || { echo "a refused run wrote a checkpoint"; exit 1; }
    fi ;;
  dcp-export)  # CLI: resumed from its own checkpoint exported to a PyTorch DCP folder, at another
              # world size: the trainer's blobs come back as the bytes it saved (DCP byte items)
    cli=$1
    run 2 "$train" "${small[@]}" --ckpt "$work/a" --steps 20 --save-every 20 > /dev/null
    "$cli" export "$work/a/step-000000020" --format dcp --out "$work/dcp" > /dev/null
    run 3 "$train" "${small[@]}" --ckpt "$work/b" --steps 30 --save-every 30 --resume-from "$work/dcp" > "$work/dcp.log" 2>&1 ||
      { cat "$work/dcp.log"; exit 1; }
    grep -q "resumed from $work/dcp at step 20" "$work/dcp.log" &&
      grep -q "per-rank RNG states not restored (the checkpoint holds no 'rng' blob)" "$work/dcp.log" &&
      [ "$(losses "$work/dcp.log" 21 30 | wc -l)" -eq 10 ] && test -f "$work/b/step-000000030/manifest.json" ||
      { echo "resume from the DCP export"; cat "$work/dcp.log"; exit 1; } ;;
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
    # Beside a live save (its lock held), the save's temporary folder is not called a leftover.
    tmp_dir="$work/r/step-000000070.tmp-0123456789abcdef"
    mkdir "$tmp_dir"
    flock "$work/r/.shardckpt.lock" "$cli" prune "$work/r" --keep-last 1 --dry-run > "$work/live.out"
    grep -q "^a save or prune holds $work/r now" "$work/live.out" && ! grep -q "tmp-0123456789abcdef" "$work/live.out" ||
      { echo "prune --dry-run beside a live save:"; cat "$work/live.out"; exit 1; }
    "$cli" prune "$work/r" --keep-last 1 --dry-run | grep -q "^would remove $tmp_dir" ||
      { echo "prune --dry-run did not list a dead save's temporary folder"; exit 1; }
    rmdir "$tmp_dir"
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
    # A full disk: `latest` (stale, naming the oldest step) cannot be rewritten and no prune lock
    # file can be made, yet prune is how space is freed: it removes first (here a dead save's
    # leftover), keeping the folder `latest` names, then mends `latest`. It stopped at the repair.
    steps=$(ls "$work/r" | grep '^step-[0-9]*$')
    oldest=$(echo "$steps" | head -1) newest=$(echo "$steps" | tail -1)
    [ "$(echo "$steps" | wc -l)" -eq 3 ] || { echo "expected 3 checkpoints: $steps"; exit 1; }
    mkdir "$work/r/step-000000070.tmp-0123456789abcdef" && echo x > "$work/r/step-000000070.tmp-0123456789abcdef/rank-00000.bin"
    echo "$oldest" > "$work/r/latest"
    SHARDCKPT_FAILPOINTS="lock.open#1=ENOSPC;commit.repair_latest.write#1=ENOSPC" "$cli" prune "$work/r" --keep-last 2 \
      > "$work/full.out" 2> "$work/full.err" || { cat "$work/full.out" "$work/full.err"; echo "prune on a full disk failed"; exit 1; }
    grep -q "no room for $work/r/.shardckpt.prune.lock; pruning under a lock on the folder $work/r" "$work/full.err" &&
      grep -q "retention: $work/r/$oldest is kept for now: \`latest\` names it and could not be rewritten" "$work/full.err" &&
      grep -q "No space left on device.*; removing first (keeping $oldest, which \`latest\` names), then mending \`latest\`" "$work/full.err" &&
      grep -q "^removed $work/r/step-000000070.tmp-0123456789abcdef$" "$work/full.out" &&
      [ "$(cat "$work/r/latest")" = "$newest" ] && [ "$(ls "$work/r" | grep '^step-')" = "$steps" ] ||
      { cat "$work/full.out" "$work/full.err"; ls "$work/r"; echo "prune on a full disk"; exit 1; }
    # `latest` still not to be mended after the removals: said, exit 1, and the folder it names kept.
    echo "$oldest" > "$work/r/latest"
    set +e
    SHARDCKPT_FAILPOINTS="commit.repair_latest.write=ENOSPC" "$cli" prune "$work/r" --keep-last 2 --json > "$work/full.json" 2> "$work/full.err"
    status=$?
    set -e
    [ $status -eq 1 ] && grep -q '^`latest` is still not mended: NoSpace' "$work/full.err" &&
      [ "$(cat "$work/r/latest")" = "$oldest" ] && [ "$(ls "$work/r" | grep '^step-')" = "$steps" ] &&
      python3 -c "import json, sys; r = json.load(open(sys.argv[1])); assert r['ok'] is False and r['latest']['code'] == 'NoSpace', r; \
assert [f['folder'] for f in r['left_alone']] == [sys.argv[2]] and 'latest' in r['left_alone'][0]['message'], r" \
        "$work/full.json" "$oldest" || { cat "$work/full.json" "$work/full.err"; echo "prune with latest not mendable: exit $status"; exit 1; }
    echo "$newest" > "$work/r/latest"
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
    # A folder that cannot be deleted (here the killed prune's leftover) is named, exit 1, and the
    # rest is still removed (the prune stopped at the first such folder, removing nothing more).
    set +e
    SHARDCKPT_FAILPOINTS="retention.remove#1=EPERM" "$cli" prune "$work/r" --keep-last 1 --json > "$work/perm.json" 2> /dev/null
    status=$?
    set -e
    [ $status -eq 1 ] || { echo "prune with an undeletable folder exited $status"; cat "$work/perm.json"; exit 1; }
    python3 - "$work/perm.json" << 'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is False and len(r["failed"]) == 1, r
assert r["failed"][0]["code"] == "IoError" and "Operation not permitted" in r["failed"][0]["message"], r
assert len(r["removed"]) == 1 and r["removed"][0].startswith("step-") and r["removed"][0] != "step-000000060", r
PY
    [ "$(ls "$work"/r/step-*/manifest.json)" = "$work/r/step-000000060/manifest.json" ] || { ls -R "$work/r"; exit 1; }
    "$cli" prune "$work/r" --keep-last 1 > "$work/prune.out"
    [ "$(ls "$work/r" | grep '^step-')" = step-000000060 ] || { ls "$work/r"; exit 1; }
    "$cli" verify "$work/r" > /dev/null
    # Reads that fail (a permission, a failing disk) tell nothing of the bytes: not called damaged.
    if SHARDCKPT_FAILPOINTS="io.read=EIO" "$cli" verify "$work/r" > "$work/eio.out" 2>&1; then echo "verify passed unread"; exit 1; fi
    grep -q "step-000000060: UNREADABLE (not known to be damaged): " "$work/eio.out" && ! grep -q DAMAGED "$work/eio.out" ||
      { cat "$work/eio.out"; echo "verify of unreadable files"; exit 1; } ;;
  commit-window)
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    set +e
    run 2 -x SHARDCKPT_FAILPOINTS="commit.latest.rename@0#2=kill" "$train" "${small[@]}" --ckpt "$work/k" --steps 30 \
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
  preempt)
    how=$1; cli=$2
    run 2 "$train" "${small[@]}" --steps 60 > "$work/full.log"
    flags=("${small[@]}" --ckpt "$work/p" --steps 60 --save-every 5 --async-save)
    if [ "$how" != rank ]; then
      # Every persist takes 1.5 s more, so the step-10 one is still being written at the stop.
      stopped_job "${how/mpirun/launcher}" env SHARDCKPT_FAILPOINTS="$pace;save.write_data=sleep:1500" "$launcher" \
        -np 2 --mca btl self,vader,tcp -x PREEMPT_TEST_TAG="$work" "$train" "${flags[@]}"
    else
      stopped_job rank1 run 2 -x SHARDCKPT_FAILPOINTS="$pace" -x PREEMPT_TEST_TAG="$work" "$train" "${flags[@]}"
    fi
    [ "$status" -eq 0 ] || { echo "the preempted job exited $status, not 0"; exit 1; }
    s=$(stop_step 2 "$work/stopped.log")
    [ "$s" -ge 12 ] && [ "$s" -lt 60 ] || { echo "stopped after step $s, not in the middle"; exit 1; }
    dir=$(printf 'step-%09d' "$s")
    if [ "$how" != rank ]; then
      grep -qE '^preemption: waiting for the checkpoint of step [0-9]+ still being written' "$work/stopped.log"
    else
      grep -q "^preemption: SIGTERM received by rank 1 " "$work/stopped.log"
      grep -q "rank 0: stopping after step $s (asked by rank 1)" "$work/stopped.log"
      grep -q "rank 1: stopping after step $s (SIGTERM received here" "$work/stopped.log"
    fi
    grep -q "^preempted after step $s: final checkpoint committed at $work/p/$dir, .* resume with --resume (exit status 0)" \
      "$work/stopped.log"
    test "$(cat "$work/p/latest")" = "$dir"
    "$cli" verify "$work/p"
    diff <(losses "$work/full.log" 1 "$s") <(losses "$work/stopped.log" 1 "$s")
    run 2 "$train" "${flags[@]}" --resume > "$work/resumed.log"
    grep -q "resumed from $work/p/$dir at step $s " "$work/resumed.log"
    diff <(losses "$work/full.log" $((s + 1)) 60) <(losses "$work/resumed.log" $((s + 1)) 60)
    [ "$(losses "$work/resumed.log" $((s + 1)) 60 | wc -l)" -eq $((60 - s)) ] ;;
  preempt-short-grace)
    cli=$1
    run 2 "$train" "${small[@]}" --steps 30 > "$work/full.log"
    # Saves take 3 s or more, the grace period is 4 s: a save and exit would need about 4.75 s.
    flags=("${small[@]}" --ckpt "$work/g" --steps 60 --save-every 5 --preempt-grace-s 4)
    stopped_job launcher env SHARDCKPT_FAILPOINTS="$pace;save.write_data=sleep:3000" "$launcher" -np 2 \
      --mca btl self,vader,tcp "$train" "${flags[@]}"
    [ "$status" -eq 75 ] || { echo "the job exited $status, not 75 (stopped without a final checkpoint)"; exit 1; }
    s=$(stop_step 2 "$work/stopped.log")
    prev=$(printf 'step-%09d' $(((s - 1) / 5 * 5)))
    grep -q "^preempted after step $s without a final checkpoint: not saving step $s: the last save took [0-9.]*s, .*; no save was started, so nothing is half-written; resume from $work/g/$prev (exit status 75)" \
      "$work/stopped.log"
    test "$(cat "$work/g/latest")" = "$prev"
    if ls "$work/g" | grep -q "$(printf 'step-%09d' "$s")"; then echo "a save of step $s was started"; ls "$work/g"; exit 1; fi
    "$cli" verify "$work/g"
    run 2 "$train" "${small[@]}" --ckpt "$work/g" --steps 30 --resume > "$work/resumed.log"
    grep -q "resumed from $work/g/$prev at step $(((s - 1) / 5 * 5)) " "$work/resumed.log"
    diff <(losses "$work/full.log" 21 30) <(losses "$work/resumed.log" 21 30) ;;
  preempt-pipe)  # CLI: `launcher | tee LOG` under a SIGTERM to the whole process group: tee dies
    # with it, and the stop request must still reach the ranks and be saved
    flags=("${small[@]}" --ckpt "$work/p" --steps 60 --save-every 5 --async-save)
    SHARDCKPT_FAILPOINTS="$pace;save.write_data=sleep:1500" setsid bash -c \
      '"$@" 2>&1 | tee "$0/piped.log" > /dev/null' "$work" "$launcher" -np 2 --mca btl self,vader,tcp \
      -x PREEMPT_TEST_TAG="$work" "$train" "${flags[@]}" &
    job=$!
    wait_for "$work/piped.log" '^step 12 loss'
    kill -TERM -- "-$job"
    wait "$job" || true
    for _ in $(seq 600); do [ -n "$(rank_pid 0 "$work" 2> /dev/null)" ] || break; sleep 0.1; done
    [ -z "$(rank_pid 0 "$work" 2> /dev/null)" ] || { echo "the ranks still run a minute after the stop"; exit 1; }
    ls "$work/p"
    s=$(sed 's/^step-0*//' "$work/p/latest")
    [ "$s" -ge 12 ] && [ "$s" -lt 20 ] || { echo "the last checkpoint is of step $s, not of the stop after step 12"; exit 1; }
    if ls "$work/p" | grep -q tmp; then echo "a checkpoint was left half-written"; exit 1; fi
    "$1" verify "$work/p" ;;
  launcher-killed)  # SIGKILL to launch/mpirun.sh (an operator, `timeout -k`): mpirun ran on in its own
    # session and the job trained to its end; now mpirun gets SIGTERM when the launcher dies
    setpriv --pdeathsig TERM true 2> /dev/null || { echo "skipped: setpriv has no --pdeathsig (util-linux < 2.33)"; exit 77; }
    # Whatever happens below, this case leaves no job of its own running.
    trap 'pkill -KILL -f "PREEMPT_TEST_TAG=$work |--ckpt $work/k " 2> /dev/null || true' EXIT
    "$launcher" -np 2 --mca btl self,vader,tcp -x PREEMPT_TEST_TAG="$work" "$train" "${small[@]}" \
      --ckpt "$work/k" --steps 100000 --save-every 50 > "$work/killed.log" 2>&1 &
    job=$!
    wait_for "$work/killed.log" '^step 20 loss'
    kill -KILL "$job"
    wait "$job" 2> /dev/null || true
    running() {  # the job's processes still running: a zombie mpirun waits for its new parent to reap it
      local p out=""
      for p in $(pgrep -f "PREEMPT_TEST_TAG=$work |--ckpt $work/k " || true); do
        case "$(ps -o stat= -p "$p" 2> /dev/null)" in Z*|"") ;; *) out="$out $p" ;; esac
      done
      echo "${out# }"
    }
    for _ in $(seq 300); do [ -n "$(running)" ] || break; sleep 0.1; done
    orphans=$(running)
    if [ -n "$orphans" ]; then
      echo "still running after the launcher was killed:"; ps -o pid=,stat=,args= -p "${orphans// /,}" | cut -c1-120
      kill -KILL $orphans 2> /dev/null || true
      exit 1
    fi
    grep -q "^step 20 loss" "$work/killed.log" ;;
  preempt-save-fails)  # CLI
    # The final save (the third write on rank 1) fails: every rank exits 1, the log says from where
    # to resume, and that checkpoint is intact.
    stopped_job launcher env SHARDCKPT_FAILPOINTS="$pace;save.write_data@1#3=ENOSPC" "$launcher" -np 2 \
      --mca btl self,vader,tcp -x PREEMPT_TEST_TAG="$work" "$train" "${small[@]}" --ckpt "$work/f" --steps 60 --save-every 5
    [ "$status" -eq 1 ] || { echo "the job exited $status, not 1"; exit 1; }
    s=$(stop_step 2 "$work/stopped.log")
    [ "$(grep -c "rank [01]: checkpoint failed: NoSpace: save of step $s failed: rank 1" "$work/stopped.log")" -eq 2 ]
    grep -q "^preempted after step $s: the final checkpoint of step $s failed (the error is above); resume from $work/f/step-000000010 (exit status 1)" \
      "$work/stopped.log"
    test "$(cat "$work/f/latest")" = step-000000010
    "$1" verify "$work/f" ;;
  launcher-tstp)  # Ctrl-Z and fg reach the ranks through launch/mpirun.sh (mpirun runs in its own session)
    SHARDCKPT_FAILPOINTS="$pace" setsid "$launcher" -np 2 --mca btl self,vader,tcp "$train" "${small[@]}" --steps 30 \
      > "$work/file.log" 2>&1 &
    job=$!
    wait_for "$work/file.log" '^step 5 loss'
    kill -TSTP -- "-$job"
    sleep 1
    before=$(losses "$work/file.log" 1 30 | wc -l)
    sleep 1
    [ "$(losses "$work/file.log" 1 30 | wc -l)" -eq "$before" ] || { echo "the ranks kept training after SIGTSTP"; exit 1; }
    kill -CONT -- "-$job"
    ended "$job" "$work/file.log"
    [ "$status" -eq 0 ] && [ "$(losses "$work/file.log" 1 30 | wc -l)" -eq 30 ] ;;
  preempt-startup)
    run 2 -x PREEMPT_TEST_TAG="$work" -x SHARDCKPT_FAILPOINTS="$pace" "$train" "${small[@]}" --ckpt "$work/p" --steps 30 \
      > "$work/stopped.log" 2>&1 &
    job=$!
    # SigCgt turns non-zero when the first handler is installed: MPI_Init's own (SIGSEGV, ...) or,
    # before it, the trainer's. Poll at 1 ms: the window between MPI_Init and training is short.
    signalled=""
    for _ in $(seq 20000); do
      for p in $(pgrep -x shardckpt-train); do
        case " $signalled " in *" $p "*) continue ;; esac
        env_has "$p" "PREEMPT_TEST_TAG=$work" || continue
        caught=$(awk '/^SigCgt:/ { print $2 }' "/proc/$p/status" 2> /dev/null || true)
        if [ -n "$caught" ] && [ "$caught" != 0000000000000000 ]; then kill -TERM "$p"; signalled+=" $p"; fi
      done
      [ "$(echo $signalled | wc -w)" -ge 2 ] && break
      sleep 0.001
    done
    ended "$job" "$work/stopped.log"
    [ "$status" -eq 0 ] || { echo "a stop request while MPI started: the job exited $status, not 0"; exit 1; }
    s=$(stop_step 2 "$work/stopped.log")  # 1, unless this loop was slower than MPI_Init and a step
    dir=$(printf 'step-%09d' "$s")
    grep -q "^preempted after step $s: final checkpoint committed at $work/p/$dir" "$work/stopped.log"
    test "$(cat "$work/p/latest")" = "$dir" ;;
  log-follow)  # 30 steps of 100 ms: lines spread over ~3 s as they happen, or arrive at exit at once
    SHARDCKPT_FAILPOINTS="$pace" "$train" "${small[@]}" --steps 30 |
      while IFS= read -r line; do echo "$(date +%s.%N) $line"; done > "$work/piped.log"
    awk '$2 == "step" && $3 == 1 { first = $1 } $2 == "step" && $3 == 30 { last = $1 }
         END { printf "pipe: step 1 arrived %.2fs before step 30\n", last - first; exit !(last - first > 1.5) }' \
      "$work/piped.log"
    SHARDCKPT_FAILPOINTS="$pace" "$launcher" -np 2 --mca btl self,vader,tcp "$train" "${small[@]}" --steps 30 \
      > "$work/file.log" 2>&1 &
    job=$!
    wait_for "$work/file.log" '^step 3 loss'
    kill -0 "$job" 2> /dev/null || { echo "step 3 reached the log file only when the job ended"; exit 1; }
    wait "$job"
    [ "$(losses "$work/file.log" 1 30 | wc -l)" -eq 30 ]
    # The launcher reads the rank count in mpirun's other spellings too: more ranks than cores
    # need --oversubscribe, which it adds only when it knows the count.
    more=$(( $(nproc) + 2 ))
    for spelling in "--np=$more" "-c $more" "-n=$more"; do
      # shellcheck disable=SC2086  # the spelling is two words or one
      [ "$("$launcher" $spelling hostname | wc -l)" -eq "$more" ] || { echo "launcher $spelling: not $more ranks"; exit 1; }
    done ;;
  slurm-requeue)
    run 2 "$train" "${small[@]}" --steps 40 > "$work/full.log"
    mkdir -p "$work/bin" "$work/submit/build/bin"
    ln -s "$(realpath "$train")" "$work/submit/build/bin/shardckpt-train"
    # srun: drops its own options and runs the job step as 2 local ranks under mpirun, which (like
    # srun) passes SIGUSR1 on to every task; a smaller model than the script's default.
    printf '%s\n' '#!/usr/bin/env bash' 'while [ "${1#--}" != "$1" ]; do shift; done' \
      'exec mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp ${SHARDCKPT_FAILPOINTS:+-x SHARDCKPT_FAILPOINTS} -np 2 "$@" --hidden 256' \
      > "$work/bin/srun"
    printf '#!/usr/bin/env bash\necho "$*" >> %q\n' "$work/scontrol.calls" > "$work/bin/scontrol"
    chmod +x "$work/bin/srun" "$work/bin/scontrol"
    slurm=(env PATH="$work/bin:$PATH" SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 SLURM_NNODES=1 SLURM_NTASKS=2
           SLURM_SUBMIT_DIR="$work/submit" CKPT="$work/s" STEPS=40 SAVE_EVERY=10 DEVICE=cpu)
    sbatch=$(cd "$(dirname "$0")/../../launch" && pwd)/slurm.sbatch
    cd "$work"  # not the submit folder: the script finds the trainer from SLURM_SUBMIT_DIR
    "${slurm[@]}" SLURM_RESTART_COUNT=0 SHARDCKPT_FAILPOINTS="$pace" bash "$sbatch" > "$work/attempt0.log" 2>&1 &
    job=$!
    wait_for "$work/attempt0.log" '^step 12 loss'
    kill -USR1 "$job"
    ended "$job" "$work/attempt0.log"
    [ "$status" -eq 0 ] || { echo "the first attempt exited $status, not 0"; exit 1; }
    s=$(stop_step 2 "$work/attempt0.log")
    dir=$(printf 'step-%09d' "$s")
    grep -q "^preempted after step $s: final checkpoint committed at $work/s/$dir" "$work/attempt0.log"
    grep -q "^stopped on request: requeueing" "$work/attempt0.log"
    test "$(cat "$work/scontrol.calls")" = "requeue 4242"
    "${slurm[@]}" SLURM_RESTART_COUNT=1 bash "$sbatch" > "$work/attempt1.log" 2>&1
    cat "$work/attempt1.log"
    grep -q "^job 4242 attempt 1: " "$work/attempt1.log"
    grep -q "resumed from $work/s/$dir at step $s " "$work/attempt1.log"
    diff <(losses "$work/full.log" $((s + 1)) 40) <(losses "$work/attempt1.log" $((s + 1)) 40)
    [ "$(losses "$work/attempt1.log" $((s + 1)) 40 | wc -l)" -eq $((40 - s)) ]
    test "$(wc -l < "$work/scontrol.calls")" -eq 1 || { echo "a finished attempt requeued"; exit 1; } ;;
  rank-fails)
    run 2 "$train" "${small[@]}" --ckpt "$work/r" --steps 10 --save-every 10 > /dev/null
    for how in "r --resume" "s --save-every 5" "a --save-every 5 --async-save"; do
      set -- $how
      start=$(date +%s)
      set +e
      run 2 -x SHARDCKPT_FAILPOINTS="train.state@1=EIO" -x SHARDCKPT_COLLECTIVE_TIMEOUT_S=60 "$train" "${small[@]}" \
        --ckpt "$work/$1" --steps 20 "${@:2}" > "$work/fails.log" 2>&1
      status=$?
      set -e
      took=$(( $(date +%s) - start ))
      cat "$work/fails.log"
      [ $status -ne 0 ] || { echo "$how: the run exited 0"; exit 1; }
      [ $took -lt 40 ] || { echo "$how: took ${took}s: a rank waited for the collective deadline"; exit 1; }
      for r in 0 1; do
        grep -qE "rank $r: .*rank 1: .*injected at failpoint train.state" "$work/fails.log" ||
          { echo "$how: rank $r did not report rank 1's error"; exit 1; }
      done
      ! grep -q DeadlineExceeded "$work/fails.log" || { echo "$how: a collective timed out"; exit 1; }
    done ;;
  resume-agrees)
    run 2 "$train" "${small[@]}" --ckpt "$work/c" --steps 10 --save-every 10 > /dev/null
    mkdir -p "$work/empty"
    start=$(date +%s)
    mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -x SHARDCKPT_COLLECTIVE_TIMEOUT_S=60 \
      -np 1 "$train" "${small[@]}" --ckpt "$work/c" --steps 12 --resume : \
      -np 1 "$train" "${small[@]}" --ckpt "$work/empty" --steps 12 --resume > "$work/resumed.log" 2>&1 ||
      { cat "$work/resumed.log"; echo "the resumed run failed"; exit 1; }
    took=$(( $(date +%s) - start ))
    [ $took -lt 40 ] || { cat "$work/resumed.log"; echo "took ${took}s: a rank waited for the collective deadline"; exit 1; }
    grep -q "resumed from .*step-000000010 at step 10" "$work/resumed.log"
    [ "$(losses "$work/resumed.log" 11 12 | wc -l)" -eq 2 ] ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
echo "train case $case $*: passed"
