#!/usr/bin/env bash
# The main job: set up and build, then run what this machine can run. On a machine without a
# usable sm_90 GPU (or with a build that has no CUDA kernels) that is the CPU accuracy study:
# the paper's quantization ablation against float64 truth. Extra arguments go to
# `snapmla accuracy` (e.g. --seeds 3 --data mla,gaussian).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -d "$HOME/.local/bin" ] && export PATH="$HOME/.local/bin:$PATH"
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target snapmla_cli
info=$("$BUILD_DIR"/snapmla info)
echo "$info"
if grep -q "usable sm_90 GPU: *yes" <<<"$info"; then
  echo "run: sm_90 GPU found: timing decode_fp8 against decode_bf16 (snapmla bench)"
  "$BUILD_DIR"/snapmla bench --json "$BUILD_DIR"/h200.json --md "$BUILD_DIR"/h200.md \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "run: then the CPU accuracy study"
else
  echo "run: no usable sm_90 GPU (or no CUDA kernels in this build): running the CPU accuracy study"
fi
"$BUILD_DIR"/snapmla accuracy --json "$BUILD_DIR"/accuracy.json "$@"
