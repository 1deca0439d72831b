#!/usr/bin/env bash
# Many small tensors (issue 14 part 5): a .pt of COUNT tensors of 4 B to 16 KiB (log-uniform) plus
# four 4 MiB ones, written by Debian's torch 1.13, imported to 2 ranks, resharded (dim0) to 16 and
# 64, each consolidated back to one .pt. Prints space amplification (data file bytes over tensor
# bytes) and times per step, with a sequential copy of the same bytes in the same run and folder as
# the baseline (fio write and read, io_uring, O_DIRECT, 8 MiB blocks, depth 16, fsync at the end;
# and `cp` + sync of the .pt); last line one JSON object.
#   bash benchmarks/bench_small_tensors.sh BUILD_BIN_DIR WORK_DIR [COUNT] [WORLDS]
set -euo pipefail
bin=$(cd "$1" && pwd); work=$2; count=${3:-20000}; worlds=${4:-"16 64"}
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../tests/packing
py=/usr/bin/python3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
now() { date +%s.%N; }
# The page cache is dropped before each step, then the program and its shared libraries are read
# back in: the data stays cold, but the step's time does not include loading 50 MB of program
# from the disk (40 ms here), which fio's own figures, the baseline, do not include either.
program_files=("$bin/shardckpt" $(ldd "$bin/shardckpt" | awk '$3 ~ /^\// {print $3}'))
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; cat "${program_files[@]}" > /dev/null; }
secs() { $py -c "import sys; print('%.3f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
bytes=$($py "$tools/small_tensors.py" make state.pt "$count" 4)
pt=$(stat -c %s state.pt)
drop
# Baselines: the same number of bytes, sequentially.
fio_json() { $py -c "import json,sys; j=json.load(open(sys.argv[1])); assert not any(x['error'] for x in j['jobs']); \
d=j['jobs'][0][sys.argv[2]]; assert d['io_bytes']>=int(sys.argv[3]), 'short'; print('%.1f' % (d['io_bytes']/d['runtime']*1000/1e6))" "$@"; }
fsize=$(( (bytes + 8388607) / 8388608 * 8388608 ))
# fio's buffers get transparent huge pages, as shardckpt's staging does (benchmarks/bench_fio.h)
fio_tunables=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1
GLIBC_TUNABLES=$fio_tunables fio --name=w --filename=fio.dat --rw=write --bs=8M --size=$fsize --ioengine=io_uring --direct=1 --iodepth=16 \
    --end_fsync=1 --output-format=json > fio_w.json
GLIBC_TUNABLES=$fio_tunables fio --name=r --filename=fio.dat --rw=read --bs=8M --size=$fsize --ioengine=io_uring --direct=1 --iodepth=16 \
    --output-format=json > fio_r.json
fio_write=$(fio_json fio_w.json write $fsize); fio_read=$(fio_json fio_r.json read $fsize)
rm -f fio.dat
drop; t0=$(now); cp --reflink=never state.pt copy.pt; sync copy.pt; t1=$(now); cp_s=$(secs "$t0" "$t1"); rm -f copy.pt
amp() { $py "$tools/small_tensors.py" amplification "$1" "$bytes"; }
results="\"tensor_bytes\": $bytes, \"pt_bytes\": $pt, \"tensors\": $((count + 4)), \"fio_write_MBps\": $fio_write, \"fio_read_MBps\": $fio_read, \"cp_s\": $cp_s"
step() {  # LABEL command...: time it (page cache dropped first)
  local label=$1; shift
  drop; local a; a=$(now); "$@" > /dev/null; local b; b=$(now)
  local s; s=$(secs "$a" "$b")
  local rate; rate=$($py -c "print('%.1f' % ($bytes / 1e6 / $s))")
  printf '%-28s %8.3f s %8.1f MB/s  (fio write %s, read %s MB/s; cp %s s)\n' "$label" "$s" "$rate" "$fio_write" "$fio_read" "$cp_s"
  results="$results, \"${label}_s\": $s, \"${label}_MBps\": $rate"
}
step import_2 "$bin/shardckpt" import state.pt --out r2 --world-size 2 --layout dim0
results="$results, \"amplification_2\": $(amp r2)"
step consolidate_2 "$bin/shardckpt" consolidate r2 --out back2.pt
prev=r2
for w in $worlds; do
  step "reshard_to_$w" "$bin/shardckpt" reshard "$prev" --out "r$w" --world-size "$w" --layout dim0
  results="$results, \"amplification_$w\": $(amp "r$w")"
  step "consolidate_$w" "$bin/shardckpt" consolidate "r$w" --out "back$w.pt"
  $py "$tools/small_tensors.py" compare state.pt "back$w.pt" > /dev/null
  prev=r$w
done
for k in 2 $worlds; do echo "space amplification at $k ranks: $(amp "r$k")"; done
echo "{\"bench\": \"small_tensors\", $results}"
