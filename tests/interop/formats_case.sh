#!/usr/bin/env bash
# Files written by real torch (1.13 or 2.x), safetensors and transformers through the command
# line: every dtype, lists and values, tied weights and key order, legacy and protocol-1 files,
# Hugging Face sharded sets, names safetensors allows and a checkpoint cannot hold.
#   bash formats_case.sh SHARDCKPT_BINARY WORKDIR torch1|torch2 [pt|hf]
# (pt: .pt and single safetensors files; hf: Hugging Face sharded sets, torch2 only; default pt)
# torch2: the cached environment of launch/torch2_venv.sh (exit 77, skipped, when it is missing,
# unless SHARDCKPT_REQUIRE_TORCH2=1); torch1: Debian's /usr/bin/python3 with python3-torch.
set -euo pipefail
cli=$1; work=$2; which=$3; part=${4:-pt}
here=$(cd "$(dirname "$0")" && pwd)
py1=/usr/bin/python3
if [ "$which" = torch2 ]; then
  if ! py=$(bash "$here/../../launch/torch2_venv.sh" --find); then
    [ "${SHARDCKPT_REQUIRE_TORCH2:-0}" = 1 ] && { echo "the torch 2.x environment is required"; exit 1; }
    echo "skipped: no torch 2.x environment"; exit 77
  fi
else
  py=$py1
fi
rm -rf "$work"; mkdir -p "$work"; cd "$work"
expect_fail() {  # expect_fail TEXT command...: must exit non-zero and print TEXT on stderr
  local text=$1; shift
  if "$@" > out.txt 2> err.txt; then echo "expected failure: $*"; cat out.txt; exit 1; fi
  grep -qF -- "$text" err.txt || { echo "error of '$*' lacks '$text':"; cat err.txt; exit 1; }
  ! grep -qiE "internal|a bug" err.txt || { echo "an input error reported as a bug:"; cat err.txt; exit 1; }
  echo "refused as expected: $(head -c 300 err.txt)"
}
check() { "$py" "$here/check_formats.py" "$@"; }
"$py" "$here/make_format_cases.py" in "$part" > /dev/null 2>&1 || "$py" "$here/make_format_cases.py" in "$part"
if [ "$part" = hf ]; then
  # 5: a Hugging Face sharded set, by folder and by index; our own sharded output imports back.
  "$cli" import in/hf --out hf1 --world-size 3
  "$cli" import in/hf/model.safetensors.index.json --out hf2 --world-size 2 --layout dim0
  "$cli" consolidate hf1 --out out/model.safetensors --max-shard-size 30KB
  cp in/hf/config.json out/
  check hf in/hf out
  "$cli" import out --out hf3 --world-size 1
  "$cli" consolidate hf3 --out again/model.safetensors
  cp in/hf/config.json again/
  check hf in/hf again
  cmp <("$cli" inspect hf1 --json | "$py1" -c "import json,sys; print([e['name'] for e in json.load(sys.stdin)['entries']])") \
      <("$py1" -c "import json; print(list(json.load(open('in/hf/model.safetensors.index.json'))['weight_map']))")
  # An index naming a tensor its shard lacks is refused by name.
  mkdir bad && cp in/hf/*.safetensors bad/ && "$py1" -c "import json; d = json.load(open('in/hf/model.safetensors.index.json')); \
d['weight_map']['ghost.weight'] = 'model-00001-of-00006.safetensors'; json.dump(d, open('bad/model.safetensors.index.json', 'w'))"
  expect_fail "tensor 'ghost.weight' is not in model-00001-of-00006.safetensors" "$cli" import bad --out hfbad --world-size 2
  [ ! -e hfbad ] || { echo "a failed import left hfbad behind"; exit 1; }
  # A sharded torch.save set (pytorch_model.bin.index.json), by folder: the tensors in the index's
  # order, the tied embedding stored once (named first by the index as lm_head.weight) and tied
  # again in the .pt.
  "$cli" import in/hf_bin --out hfb --world-size 2 --json > hfb.json
  "$cli" consolidate hfb --out hfb.pt > /dev/null
  "$py" - in/hf_bin hfb.pt hfb.json <<'PY'
import json, os, sys, torch
src, out, report = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
index = json.load(open(os.path.join(src, "pytorch_model.bin.index.json")))
want = {}
for f in sorted(set(index["weight_map"].values())):
    want.update(torch.load(os.path.join(src, f), weights_only=True))
got = torch.load(out, weights_only=True)
assert list(got) == list(index["weight_map"]), (list(got)[:4], list(index["weight_map"])[:4])
assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
assert got["lm_head.weight"].untyped_storage().data_ptr() == got["model.embed_tokens.weight"].untyped_storage().data_ptr()
tied = want["lm_head.weight"].numel() * want["lm_head.weight"].element_size()
assert report["tensors"] == len(want) and report["bytes"] == index["metadata"]["total_size"] - tied, report
print("torch.save set: %d tensors in the index's order, the tied embedding stored once" % len(got))
PY
  # A name in two shards (here a tensor and a value): refused naming both, nothing written.
  mkdir clash && "$py" -c "import json, torch; torch.save({'w': torch.ones(2)}, 'clash/a.bin'); \
torch.save({'x': torch.ones(2), 'w': 3}, 'clash/b.bin'); \
json.dump({'weight_map': {'w': 'a.bin', 'x': 'b.bin'}}, open('clash/pytorch_model.bin.index.json', 'w'))"
  expect_fail "'w' is in both clash/a.bin and clash/b.bin: a set's shards must name each tensor and value once" \
    "$cli" import clash --out clashed --world-size 1
  [ ! -e clashed ] || { echo "a refused import left clashed behind"; exit 1; }
  echo "formats case $which hf: passed"
  exit 0
fi
float8=$("$py1" -c "import json; print(int(json.load(open('in/info.json'))['float8']))")

# 1, 2: every dtype this torch writes, through import, reshard and consolidation to .pt.
"$cli" import in/dtypes.pt --out dt --world-size 3
"$cli" reshard dt --out dt2 --world-size 2 --layout dim0
# A world size the format cannot hold is refused before anything is written (it once built
# per-rank state for all of them: 13 GB for 100,000,000 ranks).
expect_fail "world size 100000000 is above the format's limit of 16777216 ranks" "$cli" reshard dt --out huge --world-size 100000000
expect_fail "world size 16777217 is above the format's limit" "$cli" import in/dtypes.pt --out huge --world-size 16777217
test ! -e huge/latest
"$cli" consolidate dt2 --out dtypes.pt
check same in/dtypes.pt dtypes.pt
# safetensors holds every dtype but complex128, which is refused by tensor and dtype.
expect_fail "tensor 'c128': dtype complex128 has no safetensors type" "$cli" consolidate dt --out all.safetensors
if [ "$float8" = 1 ]; then
  "$cli" consolidate dt --out dtypes.safetensors --exclude c128
  check safetensors in/dtypes.pt dtypes.safetensors c64 f8e4m3 f8e5m2 u16 u32 u64 bf16 f8view
  # Without float8 and the unsigned types, torch 1.13 reads what consolidation writes.
  "$cli" consolidate dt --out for113.pt --exclude 'f8*' --exclude 'u[136]*'
  "$py" -c "import sys, torch; sd = torch.load(sys.argv[1], weights_only=True); \
torch.save({k: v for k, v in sd.items() if not k.startswith(('f8', 'u16', 'u32', 'u64'))}, sys.argv[2])" in/dtypes.pt ref113.pt
  "$py1" "$here/check_formats.py" same ref113.pt for113.pt
  for f in u16 c64; do
    "$cli" import in/$f.safetensors --out st-$f --world-size 2
    "$cli" consolidate st-$f --out $f.safetensors
    "$py" -c "import sys, torch, safetensors.torch as s; a = s.load_file(sys.argv[1]); b = s.load_file(sys.argv[2]); \
assert list(a) == list(b) and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a); print('safetensors', sys.argv[1], 'round trip OK')" in/$f.safetensors $f.safetensors
  done
fi

# 3: tensors in lists and tuples are entries by index; other values are blobs, restored in the .pt.
"$cli" import in/lists.pt --out ls --world-size 2 > import-lists.txt
cat import-lists.txt
for v in opt.lr epoch name nothing flags raw optim.param_groups; do grep -qx "kept as a blob (not a tensor): $v" import-lists.txt; done
"$cli" inspect ls --json | "$py1" -c "import json, sys; d = json.load(sys.stdin); \
names = [e['name'] for e in d['entries']]; assert names == ['w', 'lst.0', 'lst.1', 'opt.steps.0', 'opt.steps.1.m', 'tup.0', 'tup.1', \
'model.layers.0.weight', 'optim.state.0.exp_avg', 'optim.state.0.step', 'optim.state.1.exp_avg', 'optim.state.1.step'], names; \
assert [b['name'] for b in d['blobs']] == ['opt.lr', 'epoch', 'name', 'nothing', 'flags', 'raw', 'optim.param_groups'], d['blobs']; print('lists: entries and blobs named')"
"$cli" consolidate ls --out lists.pt
check lists in/lists.pt lists.pt
# The nesting survives a reshard; --strip-prefix gives the optimizer's own state dict.
"$cli" reshard ls --out ls3 --world-size 3 --layout dim0 > /dev/null
"$cli" consolidate ls3 --out optim.pt --include 'optim.*' --strip-prefix optim. > /dev/null
check optim in/lists.pt optim.pt
"$cli" import in/proto4.pt --out p4 --world-size 1
"$cli" consolidate p4 --out proto4.pt
check lists in/proto4.pt proto4.pt

# 4: the legacy (pre-1.6) format is read; protocol 1 is named as such and leaves nothing behind.
"$cli" import in/legacy.pt --out lg --world-size 2 | grep -qx "kept as a blob (not a tensor): epoch"
"$cli" consolidate lg --out legacy.pt
"$py" -c "import sys, torch; a = torch.load(sys.argv[1], weights_only=False); b = torch.load(sys.argv[2], weights_only=True); \
assert list(a) == list(b) and b['epoch'] == 3, list(b); \
assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a if k != 'epoch'); print('legacy read')" in/legacy.pt legacy.pt
expect_fail "a pickle of protocol 0 or 1 (no PROTO opcode) is not supported" "$cli" import in/proto1.pt --out p1 --world-size 2
# Quantized and sparse tensors: refused naming the tensor and its dtype or layout, not a pickle global.
expect_fail "tensor 'q': dtype qint8 is not supported by shardckpt" "$cli" import in/quantized.pt --out qt --world-size 2
expect_fail "tensor 'qc': dtype quint8 is not supported by shardckpt" "$cli" import in/quantized_channel.pt --out qt --world-size 2
expect_fail "tensor 's': layout torch.sparse_coo is not supported by shardckpt" "$cli" import in/sparse.pt --out sp --world-size 2
# The legacy format at other pickle protocols: 3 to 5 read, 1 refused by protocol (never "not a zip").
for p in 3 4 5; do
  "$cli" import in/legacy_p$p.pt --out lg$p --world-size 2 > /dev/null
  "$cli" consolidate lg$p --out legacy_p$p.pt > /dev/null
  "$py" -c "import sys, torch; a = torch.load(sys.argv[1], weights_only=False); b = torch.load(sys.argv[2], weights_only=True); \
assert list(a) == list(b) and b['epoch'] == 3; assert all(torch.equal(a[k], b[k]) for k in a if k != 'epoch')" in/legacy_p$p.pt legacy_p$p.pt
done
expect_fail "a pickle of protocol 0 or 1 (no PROTO opcode) is not supported" "$cli" import in/legacy_p1.pt --out lg1 --world-size 2
[ ! -e p1 ] || { echo "a failed import left p1 behind"; ls -la p1; exit 1; }

# 6: tied weights are stored once, kept tied through reshard and .pt, and the key order is kept.
"$cli" import in/tied.pt --out td --world-size 2 --json > tied.json
"$py1" -c "import json; d = json.load(open('tied.json')); assert d['tensors'] == 4 and d['bytes'] == 192, d; print('tied: stored once')"
"$cli" reshard td --out td3 --world-size 3 --json > tied3.json
"$py1" -c "import json; d = json.load(open('tied3.json')); assert d['bytes'] == 192, d"
"$cli" consolidate td3 --out tied.pt --json > tied-out.json
"$py1" -c "import json; d = json.load(open('tied-out.json')); assert d['aliases'] == 1 and d['tensor_bytes'] == 192, d"
check tied tied.pt
check same in/tied.pt tied.pt

# 7: a failed import into an existing root leaves it as it was: an empty folder stays (the
# refused file's import is undone), and a root that holds a checkpoint is refused before anything
# is read or written (an import or reshard into a run's root became its `latest`).
mkdir keep
expect_fail "protocol 0 or 1" "$cli" import in/proto1.pt --out keep --world-size 1
[ -z "$(ls -A keep)" ] || { echo "a failed import left files in an existing empty root"; exit 1; }
"$cli" import in/tied.pt --out keep --world-size 1 > /dev/null
before=$(cd keep && find . | sort)
expect_fail "keep already holds checkpoints (latest: step-000000000): import and reshard write each into a new root" \
  "$cli" import in/tied.pt --out keep --world-size 2
expect_fail "keep already holds checkpoints" "$cli" reshard dt --out keep --world-size 2
[ "$before" = "$(cd keep && find . | sort)" ] || { echo "a refused import changed an existing root"; exit 1; }

if [ "$which" = torch2 ]; then
  # 8: an empty tensor name (safetensors allows it) is refused plainly.
  expect_fail "a tensor has an empty name" "$cli" import in/empty_name.safetensors --out en --world-size 2
  [ ! -e en ] || { echo "a failed import left en behind"; exit 1; }
fi
# 9: a torch.save file under any name (Lightning's .ckpt, model_best.pth.tar in the legacy format)
# is told by its bytes; a dict whose keys cannot name entries (a float, None, a tuple, a bool) is
# one value; a Parameter carrying Python attributes (torch 2.x pickles its state) is its tensor.
"$py" - <<'PY'
import torch
p = torch.nn.Parameter(torch.arange(3.0))
p.tensor_model_parallel = True
state = {"state_dict": {"w": torch.arange(4.0)}, "keys": {1.5: "f", None: "n", (0, 1): "t", True: "b"}, "p": p}
torch.save(state, "model.ckpt")
torch.save(state, "model_best.pth.tar", _use_new_zipfile_serialization=False)
open("notes.ckpt", "wb").write(b"epoch=3 loss=0.25\n" * 4)
import zipfile
with zipfile.ZipFile("notes.zip", "w") as z:
    z.writestr("notes.txt", "not a model")
PY
for f in model.ckpt model_best.pth.tar; do
  "$cli" import $f --out "odd-$f" --world-size 2 > /dev/null
  "$cli" consolidate "odd-$f" --out "odd-$f.pt" > /dev/null
  # (torch 1.13's weights_only reader takes no float: BINFLOAT)
  "$py" -c "import sys, torch; b = torch.load(sys.argv[1], weights_only=sys.argv[2] == 'torch2'); \
assert torch.equal(b['state_dict']['w'], torch.arange(4.0)) and torch.equal(b['p'], torch.arange(3.0)), b; \
assert b['keys'] == {1.5: 'f', None: 'n', (0, 1): 't', True: 'b'}, b['keys']; print('imported by its bytes:', sys.argv[1])" "odd-$f.pt" "$which"
done
expect_fail "cannot import 'notes.ckpt': its first bytes are none of those formats'" "$cli" import notes.ckpt --out notes --world-size 1
[ ! -e notes ] || { echo "a refused import left notes behind"; exit 1; }
expect_fail "cannot import 'notes.zip': it is a zip but not a torch.save archive (its first record is 'notes.txt', torch.save's is ARCHIVE/data.pkl)" "$cli" import notes.zip --out notes --world-size 1
# Named where a checkpoint is wanted, it is pointed to import, not called "a file".
expect_fail "model.ckpt is a model file, not a checkpoint: \`shardckpt import model.ckpt" "$cli" verify model.ckpt
# Release names: pytorch_model.bin is torch.save's format; a --strip-prefix of values only is no
# typo (it renamed them); one ending inside a character, or GGUF text that is not UTF-8, is refused.
"$cli" consolidate odd-model.ckpt --out rel/pytorch_model.bin > /dev/null
"$py" -c "import torch; b = torch.load('rel/pytorch_model.bin'); assert torch.equal(b['state_dict']['w'], torch.arange(4.0)), b"
"$cli" consolidate odd-model.ckpt --out rel/sd.pt --strip-prefix state_dict. > /dev/null 2> err.txt
! grep -q "starts no selected" err.txt || { cat err.txt; echo "a prefix that renamed values was called a typo"; exit 1; }
"$py" -c "import torch; b = torch.load('rel/sd.pt'); assert torch.equal(b['w'], torch.arange(4.0)) and 'state_dict' not in b, b"
"$py" - <<'PY'
import torch
torch.save({"\u6a21\u578b.w": torch.arange(2.0)}, "prefix.pt")
PY
"$cli" import prefix.pt --out prefix-root --world-size 1 > /dev/null
expect_fail "is not valid UTF-8 (it ends inside a character?)" "$cli" consolidate prefix-root --out rel/cjk.pt --strip-prefix $'\xe6'
[ ! -e rel/cjk.pt ] || { echo "a refused consolidate left rel/cjk.pt"; exit 1; }
# A prefix without its dot ("model" for "model.") left every name starting with '.', which
# from_pretrained took for no weight of the model (a trial): refused, saying what was meant.
expect_fail "--strip-prefix 'state_dict' leaves entry 'state_dict.w' as '.w', a name starting with '.': did you mean --strip-prefix 'state_dict.'?" \
  "$cli" consolidate odd-model.ckpt --out rel/nodot.safetensors --strip-prefix state_dict
[ ! -e rel/nodot.safetensors ] || { echo "a refused consolidate left rel/nodot.safetensors"; exit 1; }
expect_fail "GGUF metadata 'general.architecture' (--gguf-arch, --gguf-name or --gguf-metadata) is not valid UTF-8" \
  "$cli" consolidate prefix-root --out rel/cjk.gguf --gguf-arch $'\xff'
# A torch.save file cut short under a name that says nothing is damaged, not another kind of file.
head -c 300 model.ckpt > cut.ckpt
expect_fail "cut.ckpt" "$cli" import cut.ckpt --out cut --world-size 1
grep -q "DataLoss" err.txt || { cat err.txt; echo "a cut torch.save zip was not called damaged"; exit 1; }
if [ "$which" = torch2 ]; then
  # A rank's shard of DCP's HuggingFaceStorageWriter(save_distributed=True) holds pieces under
  # the whole tensors' names: refused, never imported as whole tensors.
  "$py" -c "import torch, safetensors.torch as s; s.save_file({'model.w': torch.ones(4, 4)}, 'dcp-shard.safetensors', \
metadata={'DCP_SHARDING_INFO': '{\"model.w\": {\"saved_offsets\": [4, 0]}}', 'DCP_VERSION': '1.0'})"
  expect_fail "dcp-shard.safetensors is one rank's shard of a DCP save" "$cli" import dcp-shard.safetensors --out shard --world-size 1
  # The same writer marks whole tensors too (offset 0, a file not named shard-*): imported.
  "$py" -c "import torch, safetensors.torch as s; s.save_file({'model.w': torch.ones(4, 4)}, 'dcp-whole.safetensors', \
metadata={'DCP_SHARDING_INFO': '{\"model.w\": {\"saved_offsets\": [0, 0]}}', 'DCP_VERSION': '1.0'})"
  "$cli" import dcp-whole.safetensors --out whole --world-size 2 > /dev/null
  cp dcp-whole.safetensors shard-00001-model-00001-of-00001.safetensors
  expect_fail "is one rank's shard of a DCP save" "$cli" import shard-00001-model-00001-of-00001.safetensors --out shard --world-size 1
fi
# Names in UTF-8 (CJK characters two columns wide) keep inspect's table aligned.
"$py" -c "import torch; torch.save({'层.权重': torch.ones(2), 'ascii': torch.ones(3), 'é': torch.ones(1)}, 'cjk.pt')"
"$cli" import cjk.pt --out cjk --world-size 1 > /dev/null
"$cli" inspect cjk | PYTHONIOENCODING=utf-8 "$py1" -c "
import sys, unicodedata
rows = [l for l in sys.stdin.buffer.read().decode().splitlines() if ' float32 ' in l]
cols = {sum(2 if unicodedata.east_asian_width(c) in 'WF' else 1 for c in l[:l.index(' float32 ')]) for l in rows}
assert len(rows) == 3 and len(cols) == 1, (rows, cols); print('inspect: columns aligned')"
echo "formats case $which: passed"
