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
import math, struct
numel = 0
for f in files:
    with open(os.path.join(d, f), "rb") as st:
        header = json.loads(st.read(struct.unpack("<Q", st.read(8))[0]))
    numel += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
assert index["metadata"]["total_parameters"] == numel, (index["metadata"], numel)  # as save_pretrained writes it
report = json.load(open("sharded.json"))
assert report["files"][-1].endswith("model.safetensors.index.json") and len(report["sha256"]) == len(report["files"])
import hashlib  # every file written has its SHA-256 in the report and beside it, the index too
for path, digest in zip(report["files"], report["sha256"]):
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == digest, path
    assert open(path + ".sha256").read().split()[0] == digest, path
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
    # Every verb names the folder it read or wrote and its step alike.
    "$cli" verify rs5 --json > v5.json
    $py - rs5.json v5.json sharded.json <<'PY'
import json, os, sys
rs, v, c = (json.load(open(f)) for f in sys.argv[1:])
assert rs["out"] == rs["checkpoint"] and os.path.basename(rs["out"]) == "step-%09d" % rs["step"], rs
assert rs["source"] == "root-flat" and rs["tensor_bytes"] == rs["bytes"] > 0, rs
assert v["checkpoint"] == rs["out"] and v["step"] == rs["step"], v
assert c["step"] == rs["step"] and isinstance(c["files"], list), c
print("json keys OK")
PY
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
write("meta.safetensors", {"__metadata__": {"format": "pt", "author": "me", "source": "lab"},
                           "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
write("badmeta.safetensors", {"__metadata__": {"n": 5}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
      b"\0" * 8)
PY
    # A file's __metadata__ survives import, reshard and consolidate to safetensors (format: pt).
    "$cli" import meta.safetensors --out metaroot --world-size 2 > /dev/null
    "$cli" reshard metaroot --out metaroot3 --world-size 3 > /dev/null
    "$cli" consolidate metaroot3 --out meta_back.safetensors > /dev/null
    $py -c "
import json, struct
b = open('meta_back.safetensors', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
meta = json.loads(b[8:8 + n])['__metadata__']
assert meta == {'format': 'pt', 'author': 'me', 'source': 'lab'}, meta"
    expect_fail "badmeta.safetensors: invalid safetensors: __metadata__ key 'n' holds a non-string" \
      "$cli" import badmeta.safetensors --out r12 --world-size 2
    expect_fail "overlapping entries" "$cli" import overlap.safetensors --out r6 --world-size 2
    expect_fail "trailing bytes" "$cli" import trailing.safetensors --out r7 --world-size 2
    expect_fail "header size 4611686018427387904 is too large" "$cli" import huge.safetensors --out r8 --world-size 2
    expect_fail "its shape needs 12" "$cli" import badlen.safetensors --out r9 --world-size 2
    head -c 60 overlap.safetensors > cut.safetensors
    expect_fail "cut.safetensors: invalid safetensors: the header is 128 bytes but the file holds 52 after its size (truncated)" \
      "$cli" import cut.safetensors --out r11 --world-size 2
    # verify --json names what a damaged block holds as lists: a name with a comma and a quote
    # stays one name, values are apart from tensors.
    $py -c "import torch; torch.save({\"it's, x\": torch.ones(3), 'a': torch.ones(2), 'n': 7}, 'names.pt')"
    "$cli" import names.pt --out named --world-size 1 > /dev/null
    $py -c "
import glob; f = open(glob.glob('named/step-*/rank-00000.bin')[0], 'r+b'); b = f.read(1); f.seek(0); f.write(bytes([b[0] ^ 1]))"
    if "$cli" verify named --json > named.json; then echo "verify passed a flipped byte"; exit 1; fi
    $py -c "
import json; d = json.load(open('named.json')); p = d['problems'][0]
assert d['ok'] is False and p['offset'] == 0 and sorted(p['entries']) == ['a', \"it's, x\"] and p['blobs'] == ['n'], p"
    # torch.device and torch.dtype values (weights_only loads them): the import keeps the tensors
    # and names each such value as skipped.
    $py -c "import torch; torch.save({'w': torch.ones(2), 'dev': torch.device('cuda', 1), 'cpu': torch.device('cpu'), 'dt': torch.float16}, 'devices.pt')"
    "$cli" import devices.pt --out devices --world-size 1 > devices.out
    for v in "dev (a torch.device value" "cpu (a torch.device value" "dt (a torch.float16 value"; do
      grep -q "^skipped: $v, a Python object rather than plain data)$" devices.out || { cat devices.out; exit 1; }
    done
    "$cli" inspect devices --json | $py -c "import json, sys; assert [e['name'] for e in json.load(sys.stdin)['entries']] == ['w']"
    expect_fail "devices/step-000000000/manifest.json is a file: give the checkpoint folder (or the root) instead, such as devices/step-000000000" \
      "$cli" verify devices/step-000000000/manifest.json
    # An empty state dict goes through import and consolidate as one.
    $py -c "import torch; torch.save({}, 'empty.pt')"
    "$cli" import empty.pt --out emptyroot --world-size 2 > /dev/null
    "$cli" consolidate emptyroot --out empty_back.pt > /dev/null
    $py -c "import torch; assert torch.load('empty_back.pt') == {}"
    # A manifest edited to name a file outside the checkpoint: its own checksum refuses it (a
    # writer who recomputes the checksum is refused by validation: tests/checkpoint_test.cc).
    "$cli" import good.pt --out good --world-size 2
    m=$(ls -d good/step-*)/manifest.json
    sed -i 's/"rank-00000.bin"/"..\/..\/etc\/passwd"/' "$m"
    expect_fail "manifest checksum mismatch" "$cli" verify good
    # --json asks for JSON on stdout on failure too: the code and the message naming the file.
    for verb in inspect verify list; do
        target=good; [ $verb = list ] && target=nowhere
        if "$cli" $verb $target --json > fail.json 2> /dev/null; then echo "$verb --json succeeded on a bad input"; exit 1; fi
        $py -c "
import json, sys
d = json.load(open('fail.json'))
assert d['ok'] is False, d
if '$verb' == 'verify':  # damage is verify's report, not an error: the manifest is its first problem
    assert [p['file'] for p in d['problems']] == ['manifest.json'] and d['problems'][0]['offset'] == 0, d
    assert 'manifest checksum mismatch' in d['problems'][0]['problem'] and 'error' not in d, d
else:
    want = {'inspect': ('DataLoss', 'manifest checksum mismatch'), 'list': ('NotFound', 'nowhere')}['$verb']
    assert d['error']['code'] == want[0] and want[1] in d['error']['message'], d
print('$verb --json failure OK')"
    done
    set +e; "$cli" frobnicate --json > unknown.json 2> /dev/null; rc=$?; set -e
    [ $rc = 2 ] && $py -c "import json; d = json.load(open('unknown.json')); assert d['error']['code'] == 'Usage' and \"unknown command 'frobnicate'\" in d['error']['message'], d" ||
      { echo "unknown command under --json: exit $rc"; cat unknown.json; exit 1; }
    # A usage error (exit 2) under --json is a JSON object too, even when the flags do not parse.
    set +e; "$cli" reshard good --json > usage.json 2> /dev/null; rc=$?; set -e
    [ $rc = 2 ] || { echo "usage error exited $rc"; exit 1; }
    $py -c "import json; d = json.load(open('usage.json')); assert d == {'ok': False, 'error': {'code': 'Usage', 'message': \"the option '--out' is required but missing\"}}, d"
    set +e; "$cli" reshard good --out r10 --world-size 2 --layout rows 2> layout.err; rc=$?; set -e
    [ $rc = 2 ] && grep -q "layout 'rows': use flat, dim0 or replicated" layout.err || { echo "bad --layout: exit $rc"; cat layout.err; exit 1; }
    # Not UTF-8 (Linux allows it in a path): the JSON error object still comes, the bytes replaced.
    set +e; "$cli" inspect $'nowhere-\xff' --json > utf.json 2> /dev/null; rc=$?; set -e
    [ $rc = 1 ] && $py -c "import json; assert json.load(open('utf.json'))['error']['code'] == 'NotFound'" ||
      { echo "non-UTF-8 path under --json: exit $rc"; cat utf.json; exit 1; }
    # A hostile index with two weight maps is refused, not thrown on.
    printf '{"weight_map":{"x":"a.safetensors"},"weight_map":{"y":"a.safetensors"}}' > twice.safetensors.index.json
    expect_fail 'invalid safetensors index: "weight_map" is given twice' "$cli" import twice.safetensors.index.json --out r13 --world-size 1
    "$cli" --version | grep -Eq '^shardckpt [0-9]+\.[0-9]+\.[0-9]+ \(checkpoint format 1\.[0-9]+\)$'
    expect_fail "manifest checksum mismatch" "$cli" consolidate good --out x.pt
    expect_fail "bad size" "$cli" consolidate good --out x.safetensors --max-shard-size lots
    expect_fail "cannot tell the format" "$cli" consolidate good --out x.dat
    # list and prune take roots: a DCP folder is a checkpoint; a dry run writes nothing (no lock
    # files either); a folder named like a step but not as saves name them is not touched.
    mkdir -p dcpish plainroot/step-5 && touch dcpish/.metadata dcpish/__0_0.distcp plainroot/step-5/notes.txt
    expect_fail "dcpish is a checkpoint, not a root" "$cli" list dcpish
    # An unset variable: said as such, as the other verbs do (was "NotFound:  is not a folder").
    expect_fail "InvalidArgument: the checkpoint root is an empty path (an unset variable?)" "$cli" list ""
    expect_fail "InvalidArgument: the checkpoint root is an empty path (an unset variable?)" "$cli" prune "" --keep-last 1
    expect_fail "dcpish is a checkpoint, not a root" "$cli" prune dcpish --keep-last 1 --dry-run
    # A write into it says what it is (a DCP folder has no step folders to point at).
    expect_fail "dcpish is a checkpoint, not a root (a PyTorch DCP folder: it holds .metadata): write checkpoints into a folder of shardckpt step folders, or a new one" \
      "$cli" import good.pt --out dcpish --world-size 1
    # A root without `latest` (copied without it): said as such, not as a save that stopped.
    "$cli" import good.pt --out nolatest --world-size 1 > /dev/null && rm nolatest/latest
    "$cli" list nolatest > /dev/null 2> nolatest.err
    grep -q "^note: nolatest has no latest file; readers use step-[0-9]*, the newest committed checkpoint; the next save or prune mends it" nolatest.err ||
      { cat nolatest.err; exit 1; }
    "$cli" prune plainroot --keep-last 1 --dry-run > dry.out
    [ "$(ls -A plainroot)" = step-5 ] && grep -q "^nothing to prune: plainroot holds no checkpoint folders" dry.out ||
      { ls -A plainroot; cat dry.out; exit 1; }
    # Not a root (nothing a save writes): the real prune says so too, and leaves no lock files.
    "$cli" prune plainroot --keep-last 1 > prune.out
    test -f plainroot/step-5/notes.txt && [ "$(ls -A plainroot)" = step-5 ] &&
      grep -q "^nothing to prune: plainroot holds no checkpoint folders" prune.out || { ls -A plainroot; cat prune.out; exit 1; }
    [ "$("$cli" list plainroot --json | $py -c 'import json,sys; print(len(json.load(sys.stdin)["checkpoints"]))')" = 0 ]
    mkdir -p outdir
    expect_fail "outdir is a folder: name the file to write in it (outdir/model.pt)" "$cli" consolidate good --out outdir --format torch
    [ -z "$(ls -A outdir)" ] && [ ! -e outdir.partial ] || { echo "consolidate into a folder wrote something"; exit 1; } ;;
  *) echo "unknown case"; exit 2 ;;
esac
echo "interop case $case: passed"
