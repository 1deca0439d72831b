#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds, runs every test.
set -euo pipefail
. "$(dirname "$0")/../launch/usage.sh"
refuse_arguments "$@"
cd "$(dirname "$0")/.."
bash launch/install_deps.sh
bash launch/build.sh
# torch 2.x from PyPI for the DTensor/FSDP2/DCP/GGUF tests: created once, cached outside the clone.
bash launch/torch2_venv.sh > /dev/null
export SHARDCKPT_REQUIRE_TORCH2=1
(cd build && ctest -j2 --output-on-failure --timeout 600)
# The same suite (libtorch-free targets) under AddressSanitizer and UBSan. OpenMPI's own
# allocations outlive MPI_Finalize, so leak reports are off; any other report fails its test.
cmake --preset asan > build-asan.log 2>&1 || { cat build-asan.log; exit 1; }
cmake --build build-asan -j"${SHARDCKPT_JOBS:-2}" >> build-asan.log 2>&1 || { tail -50 build-asan.log; exit 1; }
cd build-asan
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest -j2 --output-on-failure --timeout 900 -LE campaign
