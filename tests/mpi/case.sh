#!/usr/bin/env bash
# Multi-rank test cases, run by CTest: bash case.sh CHECK_BINARY WORKDIR CASE ARGS...
# Each case exits non-zero when any rank's check fails (shardckpt_mpi_check prints FAIL lines).
set -euo pipefail
check=$1; work=$2; case=$3; shift 3
rm -rf "$work"; mkdir -p "$work"
run() {  # run NP [mpirun options] -- ARGS...
  local np=$1; shift
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done; shift
  mpirun --oversubscribe --allow-run-as-root --mca btl self,vader,tcp -np "$np" "${opts[@]}" "$check" "$@"
}

# The same for a job that is expected to abort (MPI_Abort from the survivors). Open MPI 4.1's
# mpirun sometimes never returns after an abort: seen under load with every rank defunct, and
# with the ranks that aborted defunct while one that was waiting in MPI_Finalize was never
# killed. What the cases test is that the survivors end the job (each case checks what every
# rank reported), so once some rank of the job has ended, mpirun gets 15 s to end the rest; then
# the ranks' states are printed, the job is stopped and counts as failed (as an abort does).
# While no rank has ended, the case's own time limit decides.
run_aborting() {
  run "$@" &
  local pid=$! ended_at="" mpirun_pid states
  while kill -0 "$pid" 2> /dev/null; do
    mpirun_pid=$pid
    [ "$(ps -p "$pid" -o comm= 2> /dev/null)" = mpirun ] || mpirun_pid=$(pgrep -P "$pid" -x mpirun || true)
    states=$( [ -n "$mpirun_pid" ] && ps --ppid "$mpirun_pid" -o stat= 2> /dev/null || true)
    if ! grep -q '^Z' <<< "$states"; then
      ended_at=""  # none ended yet, or mpirun reaped them: it is doing its job
    else
      ended_at=${ended_at:-$(date +%s)}
      if [ $(( $(date +%s) - ended_at )) -ge 15 ]; then
        echo "mpirun did not end the job 15 s after a rank had ended: stopped (Open MPI's abort race); ranks:"
        ps --ppid "$mpirun_pid" -o pid=,stat=,wchan:32=,args= 2> /dev/null | cut -c1-160 || true
        pkill -KILL -P "$mpirun_pid" 2> /dev/null || true
        kill -KILL "$mpirun_pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
        return 1
      fi
    fi
    sleep 1
  done
  wait "$pid"
}

case "$case" in
  roundtrip)  # NP FAMILY
    run "$1" -- roundtrip "$work/root" --family "$2" --step 3 ;;
  reshard)    # SAVE_NP SAVE_FAMILY LOAD_NP LOAD_FAMILY: save at N, load at M, back at N
    run "$1" -- save "$work/root" --family "$2" --step 10
    run "$3" -- load "$work/root" --family "$4" --expect-step 10
    run "$1" -- load "$work/root" --family "$2" --expect-step 10 ;;
  rank-fails) # a write error injected on rank 2 of 4 reaches every rank; the old checkpoint stays
    run 4 -- save "$work/root" --step 1
    run 4 -x SHARDCKPT_FAILPOINTS="io.write@2=ENOSPC" -- save-fails "$work/root" --step 2 \
      --expect "NoSpace: save of step 2 failed: rank 2: writing" --expect "rank-00002.bin" --expect "injected at failpoint io.write"
    run 4 -x SHARDCKPT_FAILPOINTS="commit.rename_dir=EIO" -- save-fails "$work/root" --step 2 \
      --expect "rank 0" --expect "rename"
    run 4 -- save-fails "$work/root" --step -1 --expect "InvalidArgument" --expect "step -1 is negative"
    test "$(cat "$work/root/latest")" = step-000000001
    ls "$work/root" | grep -q tmp && { echo "temp folder left behind"; exit 1; }
    run 4 -- load "$work/root" --expect-step 1
    # A damaged manifest: every rank reports rank 0's full validation, naming the file, whether the
    # others' parse of the shared text fails too (truncated) or not (one byte changed).
    for damage in flip truncate; do
      rm -rf "$work/bad"; cp -r "$work/root" "$work/bad"
      manifest=$work/bad/step-000000001/manifest.json
      if [ $damage = flip ]; then sed -i '0,/"name": "/s//"name": "X/' "$manifest"
      else truncate -s $(( $(stat -c %s "$manifest") / 2 )) "$manifest"; fi
      # Rank 0's own status, not a merge of the others' parse errors ("DataLoss: ranks 1-3: ...").
      run 4 -- load-fails "$work/bad" --expect "DataLoss: $manifest: "
    done
    # A data file missing or cut short: the rank that reads it finds it, and every rank reports
    # it, naming the folder and the file.
    for damage in remove truncate; do
      rm -rf "$work/bad"; cp -r "$work/root" "$work/bad"
      data=$work/bad/step-000000001/rank-00002.bin
      if [ $damage = remove ]; then
        rm "$data"
        run 4 -- load-fails "$work/bad" --expect "NotFound: rank 2: " --expect "data file 'rank-00002.bin' is missing"
      else
        truncate -s 4096 "$data"
        run 4 -- load-fails "$work/bad" --expect "DataLoss: rank 2: $work/bad/step-000000001" \
          --expect "data file 'rank-00002.bin' is 4096 bytes, the manifest records" --expect "(truncated)"
      fi
    done ;;
  kill)       # SIGKILL one rank in the middle of writing its data file
    run 2 -- save "$work/root" --step 1
    mkdir -p "$work/pids"
    # Rank 1 sleeps at its 4th write, with small staging buffers so that is mid-file.
    set +e
    run 2 -x SHARDCKPT_FAILPOINTS="io.write@1#4=sleep:20000" -- save "$work/root" --step 2 \
      --staging-bytes 65536 --pid-dir "$work/pids" &
    job=$!
    for _ in $(seq 1 200); do
      partial=$(ls "$work"/root/step-000000002.tmp-*/rank-00001.bin 2>/dev/null || true)
      if [ -n "$partial" ] && [ -s "$partial" ] && [ -f "$work/pids/rank-1.pid" ]; then break; fi
      sleep 0.1
    done
    [ -n "$partial" ] || { echo "save never started writing"; kill $job; exit 1; }
    echo "killing rank 1 (pid $(cat "$work/pids/rank-1.pid")) while $partial is $(stat -c %s "$partial") bytes"
    kill -KILL "$(cat "$work/pids/rank-1.pid")"
    wait $job; status=$?
    set -e
    [ $status -ne 0 ] || { echo "the killed save reported success"; exit 1; }
    test "$(cat "$work/root/latest")" = step-000000001
    run 2 -- load "$work/root" --expect-step 1
    # The next save cleans up the dead one's folder and commits.
    run 2 -- save "$work/root" --step 2
    ls "$work/root" | grep -q tmp && { echo "temp folder left behind"; exit 1; }
    run 2 -- load "$work/root" --expect-step 2 ;;
  readers)    # issue 16 part 0: a 2-rank job saves every step with keep-last 1 while a 2-rank
              # job loops loads of the root and a loop runs `shardckpt verify` on it: every read works
    cli=$(dirname "$check")/shardckpt
    run 2 -- save "$work/root" --step 1
    run 2 -- save-loop "$work/root" --step 2 --count 40 --keep-last 1 > "$work/saves.log" 2>&1 &
    saver=$!
    # Two mpiruns started together under one session-dir base race to create it: Open MPI 4.1's
    # mpirun failed with "mkdir ... ompi.vm.0: File exists" (seen twice in full-suite runs).
    # The loader's job gets a base of its own.
    loader_tmp="${OMPI_MCA_orte_tmpdir_base:-${TMPDIR:-/tmp}}/loader-$$"
    mkdir -p "$loader_tmp"
    OMPI_MCA_orte_tmpdir_base=$loader_tmp run 2 -- load-loop "$work/root" --count 15 > "$work/loads.log" 2>&1 &
    loader=$!
    verifies=0
    while kill -0 $saver 2>/dev/null; do
      "$cli" verify "$work/root" > "$work/verify.out" 2>&1 || { cat "$work/verify.out"; kill $saver $loader; exit 1; }
      verifies=$((verifies + 1))
    done
    wait $saver || { cat "$work/saves.log"; exit 1; }
    wait $loader || { grep FAIL "$work/loads.log" || tail -20 "$work/loads.log"; exit 1; }
    rm -rf "$loader_tmp"
    echo "$verifies verifies and $(grep -c 'OK loaded' "$work/loads.log") rank loads succeeded during 40 saves"
    [ "$verifies" -ge 5 ] || { echo "too few verifies overlapped the saves"; exit 1; } ;;
  async)      # async save: snapshot semantics, staging reuse, background failures
    run 2 -- async "$work/root" --step 5 --staging-bytes 65536
    run 2 -x SHARDCKPT_FAILPOINTS="io.write@1=EIO" -- async "$work/failing" --step 5 \
      --expect "IoError: save of step 5 failed: rank 1: writing" --expect "injected at failpoint io.write"
    # Copy while training (issue 14 part 7): StartSave, then the fence before the tensors change.
    run 2 -- async "$work/deferred" --step 5 --staging-bytes 65536 --deferred 1
    run 2 -x SHARDCKPT_FAILPOINTS="async.snapshot@1=EIO" -- async "$work/deferred-failing" --step 5 --deferred 1 \
      --expect "IoError: rank 1: snapshot of step 5"
    # No thread for the persist on one rank (a pids limit): every rank fails, none waits in the
    # save's collectives for the deadline, and the next save goes ahead.
    run 2 -x SHARDCKPT_FAILPOINTS="async.thread@1#1=EAGAIN" -- async "$work/no-thread" --step 5 \
      --expect "Internal: rank 1: cannot start the save's thread" --expect "injected at failpoint async.thread" --then-succeeds 1
    run 2 -x SHARDCKPT_FAILPOINTS="async.thread@1#1=EAGAIN" -- async "$work/no-thread-deferred" --step 5 --deferred 1 \
      --expect "Internal: rank 1: snapshot of step 5: cannot start the save's thread" --then-succeeds 1 ;;
  replicated-reads) # issue 14 part 4: replicated state read once and broadcast (batched), or by
              # every rank; chosen by option or environment, the same on every rank
    run 3 -- save "$work/root" --family replicated --step 4
    run 3 -- load "$work/root" --family replicated --expect-step 4 --replicated-reads broadcast
    run 3 -- load "$work/root" --family replicated --expect-step 4 --replicated-reads broadcast --broadcast-batch 4096
    run 3 -- load "$work/root" --family replicated --expect-step 4 --replicated-reads every-rank
    run 3 -- load "$work/root" --family replicated --expect-step 4
    # Rank 1 does not verify: no rank reads for it nor it for others (the load checks that).
    run 3 -- load "$work/root" --family replicated --expect-step 4 --unverified-rank 1
    run 3 -x SHARDCKPT_REPLICATED_READS=broadcast -- load "$work/root" --family replicated --expect-step 4 \
      --replicated-reads every-rank
    run 3 -x SHARDCKPT_REPLICATED_READS=sometimes -- load-fails "$work/root" --family replicated \
      --expect "SHARDCKPT_REPLICATED_READS: replicated reads 'sometimes'" --expect "ranks 0-2: " ;;
  replicated-tmpfs) # every rank reads replicated state from one page cache: each block is
              # verified by one rank (the load checks that), and a flipped bit in a block any rank
              # owns fails the load on every rank, naming the file and the block
    shm=$(mktemp -d /dev/shm/shardckpt-replicated-XXXXXX)
    trap 'rm -rf "$shm"' EXIT
    run 3 -- save "$shm" --family replicated --step 4
    run 2 -- load "$shm" --family replicated --expect-step 4
    run 3 -- load "$shm" --family replicated --expect-step 4 --replicated-reads every-rank
    data=$(ls -d "$shm"/step-*)/rank-00000.bin
    cp "$data" "$work/good.bin"
    for block in 0 1 2; do  # owned by ranks 0, 1 and 0 of 2; 0, 1 and 2 of 3
      for np in 2 3; do
        cp "$work/good.bin" "$data"
        printf '\x55' | dd of="$data" bs=1 seek=$((block * 4096 + 100)) conv=notrunc status=none
        run $np -- load-fails "$shm" --family replicated --expect "DataLoss: rank $((block % np)): $data: checksum mismatch in the block at offset $((block * 4096))"
      done
    done
    # A rank that loads without verifying verifies no other rank's share: rank 0 checks every
    # block, block 1 (rank 1's share of 2) included.
    cp "$work/good.bin" "$data"
    run 2 -- load "$shm" --family replicated --expect-step 4 --unverified-rank 1
    printf '\x55' | dd of="$data" bs=1 seek=$((4096 + 100)) conv=notrunc status=none
    run 2 -- load-fails "$shm" --family replicated --unverified-rank 1 \
      --expect "DataLoss: rank 0: $data: checksum mismatch in the block at offset 4096" ;;
  plan-cache) # repeat saves reuse the save plan until one rank's layout changes (issue 14 part 6)
    run 3 -- plan-cache "$work/root" --step 1 ;;
  dead-rank)  # HOW (exit|hang) [async]: rank 2 of 4 never reaches the save's first collective
    # (async: AsyncSaver::Create's duplication of the communicator). Every survivor must fail
    # within the timeout, naming rank 2, and the job must end (the survivors abort it) instead of
    # waiting forever. The timeout is 10 s, not less: under ASan beside the fuzz targets a live
    # survivor was once 4.6 s late to the first collective and was (rightly) reported missing too.
    start=$(date +%s)
    set +e
    run_aborting 4 -x SHARDCKPT_COLLECTIVE_TIMEOUT_S=10 -- "dead-rank${2:+-$2}" "$work/root" --step 1 --victim 2 \
      --victim-does "$1" --expect "DeadlineExceeded" --expect "rank 2 never reached it" > "$work/out.txt" 2>&1
    status=$?
    set -e
    cat "$work/out.txt"
    elapsed=$(( $(date +%s) - start ))
    [ $status -ne 0 ] || { echo "the job reported success"; exit 1; }
    [ $elapsed -lt 60 ] || { echo "the job took ${elapsed}s to end"; exit 1; }
    for r in 0 1 3; do
      grep -q "rank $r: OK failed as expected: .*rank 2 never reached it" "$work/out.txt" ||
        { echo "rank $r did not report the missing rank"; exit 1; }
      # The survivors end the job themselves; the harness stopping mpirun must not stand in for that.
      grep -q "rank $r\] aborting the job: a collective timed out" "$work/out.txt" ||
        { echo "rank $r did not abort the job"; exit 1; }
    done
    grep -q "FAIL" "$work/out.txt" && { echo "a rank failed its check"; exit 1; }
    ls "$work/root" 2>/dev/null | grep -q '^step-000000001$' && { echo "a checkpoint was committed"; exit 1; } ;;
  other-call)  # rank 2 of 3 is alive but in another collective (a load's broadcast) than the save's
    # first: every survivor's diagnosis names the call rank 2 is in, not a stuck transport (MPI may
    # let the others' first collective finish regardless, so rank 2 is at the same collective
    # number or an earlier one), and the job ends
    start=$(date +%s)
    set +e
    run_aborting 3 -x SHARDCKPT_COLLECTIVE_TIMEOUT_S=10 -- dead-rank "$work/root" --step 1 --victim 2 \
      --victim-does broadcast --expect "DeadlineExceeded" --expect "MPI_Bcast" > "$work/out.txt" 2>&1
    status=$?
    set -e
    cat "$work/out.txt"
    [ $status -ne 0 ] || { echo "the job reported success"; exit 1; }
    [ $(( $(date +%s) - start )) -lt 60 ] || { echo "the job took too long to end"; exit 1; }
    for r in 0 1; do
      grep -Eq "rank $r: OK failed as expected: .*every rank is alive.*rank 2 is (in MPI_Bcast|at collective #1 \(MPI_Bcast\)) where this rank is" \
        "$work/out.txt" || { echo "rank $r did not name the call rank 2 is in"; exit 1; }
    done
    grep -q "transport is stuck" "$work/out.txt" && { echo "a stuck transport was blamed"; exit 1; }
    grep -q "FAIL" "$work/out.txt" && { echo "a rank failed its check"; exit 1; } || true ;;
  misuse-after)  # ranks naming different checkpoints to load (rank 0's, with a warning); saves with a
    # rank in another folder; a save after MPI_Finalize
    run 3 -- misuse-after "$work/root" > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; exit 1; }
    [ "$(grep -c '^rank [0-9]: OK' "$work/out.txt")" = 3 ] &&
      grep -q "rank 1 named '$work/root/step-000000001' to load, rank 0 '$work/root/': rank 0's is loaded on every rank" \
        "$work/out.txt" &&
      [ "$(grep -c "saves into" "$work/out.txt")" = 6 ] &&  # rank 2 and rank 0, for steps 4, 5 and 6 alone
      grep -q "rank 2 saves into '$work/root-other', rank 0 into '$work/root': unless both name one folder" \
        "$work/out.txt" &&
      [ "$(grep -c "rank 2: $work/root-other/step-000000005 does not exist: step 5 was committed in rank 0's root, $work/root/step-000000005" "$work/out.txt")" = 1 ] &&
      [ "$(grep -c "rank 2: $work/root-other/step-000000006 is another folder: step 6 was committed in rank 0's root, $work/root/step-000000006" "$work/out.txt")" = 1 ] &&
      [ "$(grep -c "step 4 refused: NotFound: save of step 4 failed: rank 2: writing $work/root-other/" "$work/out.txt")" = 3 ] ||
      { cat "$work/out.txt"; exit 1; } ;;
  dead-rank-create)  # rank 2 of 4 leaves before shardckpt's communicator exists (a Python rank
    # that skips its first checkpoint): the others hung in MPI_Comm_dup; now they fail within the
    # timeout and end the job
    start=$(date +%s)
    set +e
    run_aborting 4 -x SHARDCKPT_COLLECTIVE_TIMEOUT_S=10 -- dead-rank-create "$work/root" > "$work/out.txt" 2>&1
    status=$?
    set -e
    cat "$work/out.txt"
    [ $status -ne 0 ] || { echo "the job reported success"; exit 1; }
    [ $(( $(date +%s) - start )) -lt 60 ] || { echo "the job took too long to end"; exit 1; }
    # With no census yet, a survivor does not wake the others: one that came more than a second
    # or two late may be ended by the first one's abort before it reports. Every report must be
    # the expected one, and the survivors (not the harness) must end the job.
    reported=$(grep -c "rank [013]: OK failed as expected: DeadlineExceeded: MPI_Comm_dup (shardckpt's communicator) gave up" \
      "$work/out.txt" || true)
    [ "$reported" -ge 1 ] || { echo "no survivor failed creating the communicator"; exit 1; }
    grep -q "rank [013]\] aborting the job: a collective timed out" "$work/out.txt" ||
      { echo "the survivors did not abort the job"; exit 1; }
    grep -q "FAIL" "$work/out.txt" && { echo "a rank failed its check"; exit 1; } || true ;;
  full-disk)  # a real filesystem that fills up mid-save (a size-limited tmpfs)
    mnt="$work/mnt"; mkdir -p "$mnt"
    if ! mount -t tmpfs -o size=64m shardckpt-full-disk "$mnt" 2>/dev/null; then
      echo "SKIP: cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)"; exit 77
    fi
    trap 'umount "$mnt" 2>/dev/null || true' EXIT
    run 2 -- save "$mnt/root" --step 1
    used=$(du -sk "$mnt" | cut -f1)
    # Room for about half of a second checkpoint: some rank's write must fail with ENOSPC.
    mount -o remount,size=$(( used + used / 2 ))k "$mnt"
    df -k "$mnt"
    run 2 -- save-fails "$mnt/root" --step 2 --expect "NoSpace" --expect "No space left on device" \
      --expect "rank-0000"
    test "$(cat "$mnt/root/latest")" = step-000000001
    ls "$mnt/root" | grep -q tmp && { echo "partial folder left behind"; ls -la "$mnt/root"; exit 1; }
    run 2 -- load "$mnt/root" --expect-step 1
    # With the space back, the next save succeeds where the failed one did not.
    mount -o remount,size=64m "$mnt"
    run 2 -- save "$mnt/root" --step 2
    run 2 -- load "$mnt/root" --expect-step 2 ;;
  manifest-sharing) # a round trip of the scenario with 1500 small entries, loaded with the manifest
                    # parsed by every rank and sent by rank 0, at 2 and 3 ranks, and resharded
    run 2 -- save "$work/root" --family mixed --step 3 --many-small 1500
    for np in 2 3; do
      for sharing in every-rank root; do
        run $np -- load "$work/root" --family mixed --expect-step 3 --many-small 1500 --manifest-sharing $sharing
      done
    done ;;
  many-small) # COUNT: the scenario plus COUNT tiny entries, packed (format 1.1): a round trip at 2
              # ranks, a reshard on load (2 dim0 -> 3 flat), and `shardckpt reshard` to 16 ranks
              # loaded at 4 (mixed); every byte checked each time. At the saved world size each
              # rank reads its own file during the metadata phases; resharded, none does.
    cli=$(dirname "$check")/shardckpt
    run 2 -- roundtrip "$work/root" --family mixed --many-small "$1" --expect-read-ahead 1
    run 2 -- load "$work/root" --family mixed --expect-step 1 --many-small "$1" --expect-read-ahead 1 \
      --manifest-sharing root
    run 2 -- save "$work/dim0" --family dim0 --step 4 --many-small "$1"
    python3 -c "import json,sys; v=json.load(open(sys.argv[1]))['format_version']; assert v==[1,1], v" \
      "$work"/dim0/step-000000004/manifest.json
    run 3 -- load "$work/dim0" --family flat --expect-step 4 --many-small "$1" --expect-read-ahead 0
    "$cli" reshard "$work/dim0" --out "$work/r16" --world-size 16 --layout dim0
    "$cli" verify "$work/r16"
    run 4 -- load "$work/r16" --family mixed --expect-step 4 --many-small "$1" --no-rank-blobs 1 --expect-read-ahead 0 ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
echo "case $case $*: passed"
