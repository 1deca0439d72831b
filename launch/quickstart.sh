#!/usr/bin/env bash
# The main job, end to end on one machine (README's first command):
#   install what is missing, build, train 4 ranks with checkpoints, resume on 2 ranks (resharded),
#   verify, consolidate to one .pt, load it in PyTorch, and summarize.
set -euo pipefail
. "$(dirname "$0")/usage.sh"
refuse_arguments "$@"
cd "$(dirname "$0")/.."
work=${SHARDCKPT_WORK:-/tmp/shardckpt-quickstart}
declare -A took
stage() { local name=$1; shift; local t0=$(date +%s.%N); "$@"; took[$name]=$(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN { printf \"%.1f\", b - a }"); }

stage install bash launch/install_deps.sh
stage build bash launch/build.sh
rm -rf "$work"; mkdir -p "$work"
echo "== training on 4 ranks to step 40, a checkpoint every 10 steps"
stage train4 bash launch/mpirun.sh -np 4 build/bin/shardckpt-train --ckpt "$work/ckpt" --steps 40 --save-every 10 > "$work/train4.log"
grep -E "^(shardckpt|checkpoint|step (1|10|20|30|40) )" "$work/train4.log"
echo "== resuming on 2 ranks (the 4-rank checkpoint is resharded on load) to step 60"
stage train2 bash launch/mpirun.sh -np 2 build/bin/shardckpt-train --ckpt "$work/ckpt" --steps 60 --save-every 10 --resume > "$work/train2.log"
grep -E "^(resumed|per-rank|checkpoint|step (41|50|60) )" "$work/train2.log"
echo "== verifying and consolidating the final checkpoint"
stage verify build/bin/shardckpt verify "$work/ckpt"
stage consolidate build/bin/shardckpt consolidate "$work/ckpt" --out "$work/model.pt" --include 'model.*'
echo "== loading it in PyTorch"
stage pytorch /usr/bin/python3 -c "
import sys, torch
sd = torch.load('$work/model.pt', weights_only=True)
print('torch', torch.__version__, 'loaded', len(sd), 'tensors,', sum(t.numel() for t in sd.values()), 'parameters')
for k, v in sd.items(): print('  %-20s %-14s %s' % (k, v.dtype, tuple(v.shape)))
"
cat <<SUMMARY

shardckpt quickstart: done
  checkpoints  $work/ckpt (latest: $(cat "$work/ckpt/latest"))
  model        $work/model.pt (+ .sha256)
  logs         $work/train4.log, $work/train2.log
  seconds      install ${took[install]}, build ${took[build]}, train 4 ranks ${took[train4]},
               resume on 2 ranks ${took[train2]}, verify ${took[verify]}, consolidate ${took[consolidate]}, pytorch ${took[pytorch]}
  next         build/bin/shardckpt inspect $work/ckpt
SUMMARY
