#!/usr/bin/env bash
# Configures and builds into build/ (all executables land in build/bin/). Two jobs by default:
# libtorch translation units need about 2 GiB of memory each.
set -euo pipefail
. "$(dirname "$0")/usage.sh"
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"${SHARDCKPT_JOBS:-2}" >> build.log 2>&1 || { tail -50 build.log; exit 1; }
echo "built: $(ls build/bin | tr '\n' ' ')"
