#!/usr/bin/env bash
# Round trips through real PyTorch and hostile inputs for the shardckpt command line.
#   bash interop_case.sh SHARDCKPT_BINARY WORKDIR CASE
set -euo pipefail
cli=$1; work=$2; case=$3
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3  # Debian's interpreter, where python3-torch lives
rm -rf "$work"; mkdir -p "$work"; cd "$work"
expect_fail() {  # expect_fail TEXT command...: must exit non-zero and print TEXT on stderr
  local text=$1; shift
  if "$@" > out.txt 2> err.txt; then echo "expected failure: $*"; cat out.txt; exit 1; fi
  grep -qF -- "$text" err.txt || { echo "error of '$*' lacks '$text':"; cat err.txt; exit 1; }
  echo "refused as expected: $(head -c 300 err.txt)"
}

case "$case" in
  roundtrip)
    PYTHONPATH=$here $py "$here/make_state_dict.py" original.pt
    for layout in flat dim0 replicated; do
      "$cli" import original.pt --out "root-$layout" --world-size 3 --layout "$layout" | tee import.txt
      grep -q "kept as a blob (not a tensor): not_a_tensor" import.txt
      "$cli" verify "root-$layout"
      "$cli" consolidate "root-$layout" --out "$layout.pt"
      "$cli" consolidate "root-$layout" --out "$layout.safetensors"
      PYTHONPATH=$here $py "$here/compare.py" original.pt "$layout.pt"
      PYTHONPATH=$here $py "$here/compare.py" original.pt "$layout.safetensors"
      unzip -tq "$layout.pt"
      sha256sum -c "$layout.pt.sha256" "$layout.safetensors.sha256"
      # Stored records under one top folder, with what torch.load reads besides the tensors.
      $py -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; \
assert all(i.compress_type == 0 for i in z.infolist()); \
names = z.namelist(); top = names[0].split('/')[0]; \
assert all(n.startswith(top + '/') for n in names), names; \
assert z.read(top + '/byteorder') == b'little' and z.read(top + '/version') == b'3\n', names; \
assert top + '/data.pkl' in names and any(n.startswith(top + '/data/') for n in names), names" "$layout.pt"
    done
    # 64-byte alignment of every record's data (what mmap=True needs).
    $py - flat.pt <<'PY'
import struct, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
raw = open(sys.argv[1], "rb").read()
for info in z.infolist():
    h = info.header_offset
    n, m = struct.unpack("<HH", raw[h + 26:h + 30])
    assert (h + 30 + n + m) % 64 == 0, info.filename
print("all records 64-byte aligned")
PY
    # Import of our own safetensors output, and sharded safetensors with an index.
    "$cli" import flat.safetensors --out root-st --world-size 2 --layout dim0
    "$cli" consolidate root-st --out again.pt
    PYTHONPATH=$here $py "$here/compare.py" original.pt again.pt
    "$cli" consolidate root-flat --out sharded/model.safetensors --max-shard-size 4KiB --json > sharded.json
    $py - sharded <<'PY'
import json, os, sys
d = sys.argv[1]
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
files = sorted(set(index["weight_map"].values()))
assert len(files) > 1 and all(f.startswith("model-") and "-of-" in f for f in files), files
assert index["metadata"]["total_size"] > 0
print("sharded into", len(files), "files with an index")
PY
    # Selection, prefix stripping and casting.
    "$cli" consolidate root-flat --out sel.pt --include 'shared.*' --include 'f32' --exclude 'shared.t' --strip-prefix shared. --dtype bf16
    $py - original.pt sel.pt <<'PY'
import sys, torch
orig, sel = torch.load(sys.argv[1], weights_only=True), torch.load(sys.argv[2], weights_only=True)
assert sorted(sel) == ["base", "f32", "rows"], sorted(sel)
assert sel["f32"].dtype == torch.bfloat16 and torch.equal(sel["f32"], orig["f32"].bfloat16())
assert torch.equal(sel["rows"], orig["shared.rows"].bfloat16())
print("include/exclude/strip-prefix/dtype OK")
PY
    # reshard through several world sizes and layouts and back, then compare bit for bit.
    "$cli" reshard root-flat --out rs5 --world-size 5 --layout dim0 --json > rs5.json
    "$cli" reshard rs5 --out rs2 --world-size 2 --layout replicated
    "$cli" reshard rs2 --out rs3 --world-size 3 --layout flat
    "$cli" verify rs3
    $py -c "import json; d=json.load(open('rs5.json')); assert d['world_size']==5 and d['tensors']>0; print('reshard json OK')"
    "$cli" consolidate rs3 --out resharded.pt
    PYTHONPATH=$here $py "$here/compare.py" original.pt resharded.pt
    cmp <(cd root-flat && "$cli" inspect . --json | $py -c "import json,sys; print([(e['name'],e['dtype'],e['shape']) for e in json.load(sys.stdin)['entries']])") \
        <(cd rs3 && "$cli" inspect . --json | $py -c "import json,sys; print([(e['name'],e['dtype'],e['shape']) for e in json.load(sys.stdin)['entries']])")
    # inspect --json
    "$cli" inspect root-dim0 --json > inspect.json
    $py -c "import json; d=json.load(open('inspect.json')); assert d['world_size']==3 and any(e['name']=='nested.inner.w' for e in d['entries']); print('inspect OK')" ;;
  hostile)
    PYTHONPATH=$here $py "$here/make_state_dict.py" evil1.pt hostile-os-system
    PYTHONPATH=$here $py "$here/make_state_dict.py" evil2.pt hostile-eval
    expect_fail "global 'posix.system' is not allowed" "$cli" import evil1.pt --out r1 --world-size 2
    expect_fail "eval' is not allowed" "$cli" import evil2.pt --out r2 --world-size 2
    # One test a line: under set -e the first test of an && list may fail unnoticed.
    for f in evil1.pt.pwned evil2.pt.pwned r1/latest r2/latest; do
      [ ! -e "$f" ] || { echo "$f exists: a hostile file was acted on"; exit 1; }
    done
    PYTHONPATH=$here $py "$here/make_state_dict.py" good.pt
    head -c 3000 good.pt > truncated.pt
    expect_fail "not a valid torch.save zip" "$cli" import truncated.pt --out r3 --world-size 2
    head -c 100000 /dev/urandom > garbage.pt
    expect_fail "not a valid torch.save zip" "$cli" import garbage.pt --out r4 --world-size 2
    cp garbage.pt garbage.safetensors
    expect_fail "invalid safetensors" "$cli" import garbage.safetensors --out r5 --world-size 2
    $py - <<'PY'
import json, struct
def write(path, header, body, n=None):
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", n if n is not None else len(h)) + h + body)
write("overlap.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12)
write("trailing.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 16)
write("huge.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, n=2**62)
write("badlen.safetensors", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
PY
    expect_fail "overlapping entries" "$cli" import overlap.safetensors --out r6 --world-size 2
    expect_fail "trailing bytes" "$cli" import trailing.safetensors --out r7 --world-size 2
    expect_fail "header size 4611686018427387904 is too large" "$cli" import huge.safetensors --out r8 --world-size 2
    expect_fail "its shape needs 12" "$cli" import badlen.safetensors --out r9 --world-size 2
    # A manifest edited to name a file outside the checkpoint: its own checksum refuses it (a
    # writer who recomputes the checksum is refused by validation: tests/checkpoint_test.cc).
    "$cli" import good.pt --out good --world-size 2
    m=$(ls -d good/step-*)/manifest.json
    sed -i 's/"rank-00000.bin"/"..\/..\/etc\/passwd"/' "$m"
    expect_fail "manifest checksum mismatch" "$cli" verify good
    expect_fail "manifest checksum mismatch" "$cli" consolidate good --out x.pt
    expect_fail "bad size" "$cli" consolidate good --out x.safetensors --max-shard-size lots
    expect_fail "cannot tell the format" "$cli" consolidate good --out x.bin ;;
  *) echo "unknown case"; exit 2 ;;
esac
echo "interop case $case: passed"
