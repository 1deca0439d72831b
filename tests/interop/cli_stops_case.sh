#!/usr/bin/env bash
# The command line stopped from outside: Ctrl-C or SIGTERM during a consolidation or a reshard,
# and a file-size limit (ulimit -f, as batch systems set) during one. Each must end with a
# message and leave no partial output (OUT.partial, its .OUT.lock, a checkpoint's .tmp folder)
# behind; the signals' default actions killed the tool silently, a 200 MB partial file left.
#   bash cli_stops_case.sh SHARDCKPT_BINARY WORKDIR
set -euo pipefail
cli=$1; work=$2
py=/usr/bin/python3  # Debian's interpreter, where python3-torch lives
rm -rf "$work"; mkdir -p "$work"; cd "$work"
$py -c "import torch; torch.save({'w%d' % i: torch.full((1 << 18,), float(i)) for i in range(8)}, 'state.pt')"
"$cli" import state.pt --out root --world-size 2 > /dev/null
leftovers() { find . -name '*.partial' -o -name '.*.lock' -o -name '*.tmp-*' | grep -v '^./root/.shardckpt.lock$' || true; }

# Job control on: a background job of a script without it starts with SIGINT ignored (which the
# tool keeps ignoring, as a program should).
set -m
# Every read made to sleep 400 ms (a consolidation makes eight or more): the work is still going when the signal comes, whatever the machine.
for sig in INT TERM; do
  for verb in consolidate reshard export; do
    case $verb in
      consolidate) out="out-$sig.pt"; args=(consolidate root --out "$out") ;;
      reshard) out="rs-$sig"; args=(reshard root --out "$out" --world-size 3) ;;
      export) out="dcp-$sig"; args=(export root --format dcp --out "$out") ;;
    esac
    SHARDCKPT_FAILPOINTS="io.read=sleep:400" "$cli" "${args[@]}" > /dev/null 2> err.txt &
    pid=$!
    sleep 1
    kill -$sig $pid
    rc=0; wait $pid || rc=$?
    want=$([ $sig = INT ] && echo 130 || echo 143)
    [ $rc = "$want" ] || { echo "$verb, SIG$sig: exit $rc, expected $want"; cat err.txt; exit 1; }
    grep -q "Aborted: interrupted by SIG$sig" err.txt || { echo "$verb, SIG$sig: no message"; cat err.txt; exit 1; }
    [ -z "$(leftovers)" ] || { echo "$verb, SIG$sig left: $(leftovers)"; exit 1; }
    # Nothing at OUT: no file, no checkpoint, no DCP folder (a folder export made is removed).
    [ ! -e "$out" ] || { echo "$verb, SIG$sig left $out: $(ls -A "$out")"; exit 1; }
    echo "$verb stopped by SIG$sig: exit $rc, nothing left"
  done
done

# The same signal twice in a moment, as timeout(1) sends it (to the tool, then to its process
# group, which holds the tool again): one request, stopped as above. Ended at once by the copy,
# the tool left OUT.partial and its lock behind. (The second comes after the first was handled:
# two sent back to back merge while the first is pending.)
for verb in consolidate reshard; do
  case $verb in
    consolidate) out="twice.pt"; args=(consolidate root --out "$out") ;;
    reshard) out="twice-rs"; args=(reshard root --out "$out" --world-size 3) ;;
  esac
  SHARDCKPT_FAILPOINTS="io.read=sleep:400" "$cli" "${args[@]}" > /dev/null 2> err.txt &
  pid=$!
  sleep 1
  kill -TERM $pid; sleep 0.05; kill -TERM $pid
  rc=0; wait $pid || rc=$?
  { [ $rc = 143 ] && grep -q "Aborted: interrupted by SIGTERM" err.txt; } || { echo "$verb, SIGTERM twice in a moment: exit $rc"; cat err.txt; exit 1; }
  { [ -z "$(leftovers)" ] && [ ! -e "$out" ]; } || { echo "$verb, SIGTERM twice in a moment left: $(leftovers) $(ls -d "$out" 2>/dev/null)"; exit 1; }
  echo "$verb stopped by SIGTERM sent twice in a moment: exit 143, nothing left"
done

# A sharded safetensors set written again over itself, stopped while its files are synced: the
# set written before is left whole, its index included (a stop caught after the old index was
# taken away, to make room for shards of the same names, left shards no index lists).
"$cli" consolidate root --out set/model.safetensors --max-shard-size 3MB > /dev/null
before=$(cd set && ls -A | sort | xargs sha256sum)
# The fourth (last) shard's sync is the last before the set is published: the signal comes during it.
rm -f fired
SHARDCKPT_FAILPOINTS_FIRED=$PWD/fired SHARDCKPT_FAILPOINTS="io.fsync#4=sleep:3000" \
  "$cli" consolidate root --out set/model.safetensors --max-shard-size 3MB > /dev/null 2> err.txt &
pid=$!
for _ in $(seq 300); do [ -s fired ] && break; sleep 0.05; done
[ -s fired ] || { echo "the last sync never came"; cat err.txt; exit 1; }
sleep 0.3
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc = 143 ] || { echo "sharded consolidate, SIGTERM: exit $rc"; cat err.txt; exit 1; }
[ "$(cd set && ls -A | sort | xargs sha256sum)" = "$before" ] || { echo "the earlier set changed:"; ls -A set; exit 1; }
echo "sharded consolidate stopped by SIGTERM: the earlier set whole"

# A file-size limit of 100 KiB: EFBIG reported like a full disk, nothing left.
for verb in consolidate import; do
  rc=0
  if [ $verb = consolidate ]; then
    bash -c "ulimit -f 100; exec \"$cli\" consolidate root --out limited.pt" 2> err.txt || rc=$?
  else
    bash -c "ulimit -f 100; exec \"$cli\" import state.pt --out limited --world-size 2" 2> err.txt || rc=$?
  fi
  [ $rc = 1 ] || { echo "$verb under ulimit -f: exit $rc, expected 1"; cat err.txt; exit 1; }
  grep -q "File too large" err.txt || { echo "$verb under ulimit -f: no message"; cat err.txt; exit 1; }
  [ -z "$(leftovers)" ] && [ ! -e limited.pt ] || { echo "$verb under ulimit -f left: $(leftovers)"; exit 1; }
  echo "$verb under ulimit -f: $(head -c 120 err.txt)"
done
# The checkpoint read is untouched.
"$cli" verify root > /dev/null
echo "ok"
