#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/install_deps.sh
bash launch/build.sh
cd build
ctest -j2 --output-on-failure --timeout 600
