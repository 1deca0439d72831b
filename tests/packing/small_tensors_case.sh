#!/usr/bin/env bash
# Many small tensors through the command line (format 1.1 packing): import to 2 ranks, reshard to
# 16 (dim0), consolidate, every value compared with torch, space amplification (data file bytes
# over tensor bytes) at most 1.05 at each world size; and a format 1.0 checkpoint written before
# packing existed still verifies and consolidates to its source.
#   bash small_tensors_case.sh SHARDCKPT_BINARY WORKDIR COUNT
set -euo pipefail
cli=$1; work=$2; count=$3
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3  # Debian's interpreter, where python3-torch lives
rm -rf "$work"; mkdir -p "$work"; cd "$work"
bytes=$($py "$here/small_tensors.py" make state.pt "$count" 2)
check_amplification() {  # ROOT LABEL
  local a; a=$($py "$here/small_tensors.py" amplification "$1" "$bytes")
  echo "$2: space amplification $a"
  $py -c "import sys; sys.exit(0 if float('$a') <= 1.05 else 1)" || { echo "FAIL: $2 amplification $a > 1.05"; exit 1; }
}
"$cli" import state.pt --out r2 --world-size 2 --layout dim0
$py -c "import json,glob; m=json.load(open(glob.glob('r2/step-*/manifest.json')[0])); assert m['format_version']==[1,1], m['format_version']"
check_amplification r2 "import to 2 ranks"
"$cli" reshard r2 --out r16 --world-size 16 --layout dim0
check_amplification r16 "reshard to 16 ranks"
"$cli" verify r16
"$cli" consolidate r16 --out back.pt
$py "$here/small_tensors.py" compare state.pt back.pt
"$cli" reshard r16 --out r3 --world-size 3 --layout flat
"$cli" consolidate r3 --out back3.safetensors
$py -c "
import torch, json, struct
a = torch.load('state.pt')
data = open('back3.safetensors','rb').read(); n = struct.unpack('<Q', data[:8])[0]; h = json.loads(data[8:8+n]); body = data[8+n:]
dt = {'F32': torch.float32, 'BF16': torch.bfloat16, 'F16': torch.float16, 'I64': torch.int64}
for k, t in a.items():
    b, e = h[k]['data_offsets']
    u = torch.frombuffer(bytearray(body[b:e]), dtype=dt[h[k]['dtype']]).reshape(h[k]['shape']) if e > b else torch.empty(h[k]['shape'], dtype=dt[h[k]['dtype']])
    assert torch.equal(t, u), k
print('safetensors from 3 flat ranks: equal')"
# Format 1.0 (every chunk on a 4096-byte block), committed before packing: still read.
cp -r "$here/../fixtures/format-1.0/step-000000000" old
"$cli" verify old
"$cli" inspect old | grep -q "1.0"
"$cli" consolidate old --out old.pt
$py "$here/small_tensors.py" compare "$here/../fixtures/format-1.0/source.pt" old.pt
echo "OK"
