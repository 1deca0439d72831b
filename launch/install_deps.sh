#!/usr/bin/env bash
# Installs what shardckpt needs on Debian 12, only when something is missing (no apt-get at all
# on a machine that has everything). Used by the README's two commands.
set -euo pipefail
. "$(dirname "$0")/usage.sh"
refuse_arguments "$@"
packages=(build-essential cmake pkg-config git libtorch-dev libopenmpi-dev openmpi-bin liburing-dev
          nlohmann-json3-dev libxxhash-dev libgtest-dev libgmock-dev libboost-program-options-dev
          libssl-dev libdeflate-dev python3-torch python3-dev python3-venv pybind11-dev python3-pytest unzip clang-14 libclang-rt-14-dev fio)
# Rebuilds of clean clones (tests/run_all.sh, CI) reuse objects from ccache's cache (~/.cache/ccache).
packages+=(ccache)
# The manifest reader (engine/model/manifest.cc).
packages+=(libsimdjson-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
