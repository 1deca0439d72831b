#!/usr/bin/env bash
# Creates (once) and prints the path of the virtual environment holding a current torch 2.x from
# PyPI, for the tests and benchmarks that need DTensor, FSDP2, DCP, mmap or the gguf package.
# It lives outside the clone (SHARDCKPT_CACHE, default ~/.cache/shardckpt) so a fresh clone on the
# same machine reuses it; a stamp naming the pinned set marks it complete, so an interrupted
# install is finished rather than half-used, and a changed pin set installs only what changed.
# Never touches the system Python.
#   usage: PY=$(bash launch/torch2_venv.sh)         creates it if needed; the interpreter on stdout
#          PY=$(bash launch/torch2_venv.sh --find)  never creates: exit 3 when it is not there yet
set -euo pipefail
. "$(dirname "$0")/usage.sh"
cache=${SHARDCKPT_CACHE:-$HOME/.cache/shardckpt}
# Pinned so every machine tests the same thing; bump together with the README's "Formats" table.
pins=(torch==2.15.0 numpy==2.3.5 safetensors==0.8.0 gguf==0.19.0 transformers==5.23.0 mpi4py==4.1.2 pytest)
stamp_text="${pins[*]}"
venv=$cache/venv-torch2
if [ -f "$venv/.shardckpt-stamp" ] && [ "$(cat "$venv/.shardckpt-stamp")" = "$stamp_text" ]; then
  echo "$venv/bin/python"
  exit 0
fi
if [ "${1:-}" = --find ]; then
  echo "torch2_venv: no complete environment at $venv (create it: bash launch/torch2_venv.sh)" >&2
  exit 3
fi
base=${SHARDCKPT_VENV_BASE_PYTHON:-/usr/bin/python3}
if ! "$base" -c 'import ensurepip' 2> /dev/null; then
  echo "torch2_venv: $base cannot create virtual environments (Debian: apt-get install python3-venv)" >&2
  exit 1
fi
echo "torch2_venv: installing ${pins[*]} into $venv (first time: a download of about 3 GB)" >&2
mkdir -p "$cache"
[ -x "$venv/bin/python" ] || "$base" -m venv "$venv"
rm -f "$venv/.shardckpt-stamp"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}" >&2
"$venv/bin/python" -c 'import torch, torch.distributed.checkpoint, safetensors, gguf' >&2
echo "$stamp_text" > "$venv/.shardckpt-stamp"
echo "$venv/bin/python"
