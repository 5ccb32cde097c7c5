#!/usr/bin/env bash
# The whole test suite: set up, build (warnings are errors), run every test with CTest.
# GPU tests (label `gpu`) skip with a visible message on a machine without an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -d "$HOME/.local/bin" ] && export PATH="$HOME/.local/bin:$PATH"
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DSNAPMLA_BUILD_TESTS=ON -DSNAPMLA_WERROR=ON
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
