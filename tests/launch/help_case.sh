#!/usr/bin/env bash
# Every launch script (and the test command) answers -h/--help with its leading comment and exit
# 0, doing nothing else: run in a copy of the scripts, where a build, an install or quickstart's
# `rm -rf` of its work folder would leave traces this checks for. Scripts that take no arguments
# refuse one with exit 2, naming it.
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/launch" "$work/tests"
cp "$src"/launch/*.sh "$work/launch/"
cp "$src/tests/run_all.sh" "$work/tests/"
export SHARDCKPT_WORK="$work/quickstart-work" SHARDCKPT_CACHE="$work/cache"
mkdir -p "$SHARDCKPT_WORK"
touch "$SHARDCKPT_WORK/kept"
for script in launch/build.sh launch/quickstart.sh launch/install_deps.sh launch/mpirun.sh launch/torch2_venv.sh \
              launch/train_fsdp2.sh tests/run_all.sh; do
  for flag in --help -h; do
    out=$(cd "$work" && bash "$script" "$flag") || { echo "$script $flag exited $?"; exit 1; }
    # The first line of the help is the script's second line, without its "# ".
    want=$(sed -n '2s/^# //p' "$work/$script")
    [ "$(head -1 <<< "$out")" = "$want" ] || { echo "$script $flag printed: $out"; exit 1; }
  done
done
for script in launch/quickstart.sh launch/install_deps.sh tests/run_all.sh; do
  set +e
  err=$(cd "$work" && bash "$script" --resume 2>&1)
  status=$?
  set -e
  [ $status -eq 2 ] || { echo "$script --resume exited $status: $err"; exit 1; }
  grep -q "takes no arguments (got: --resume)" <<< "$err" || { echo "$script: $err"; exit 1; }
done
# Nothing was built, configured, installed or removed.
[ ! -e "$work/build" ] && [ ! -e "$work/build.log" ] && [ ! -e "$work/cache" ] || { ls -a "$work"; exit 1; }
[ -e "$SHARDCKPT_WORK/kept" ] || { echo "quickstart removed its work folder"; exit 1; }
echo "launch scripts: --help and -h print their documentation and do nothing else"
