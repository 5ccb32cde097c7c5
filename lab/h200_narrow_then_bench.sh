#!/usr/bin/env bash
# One H200 call (device tool): decode_bf16's narrow tile under the GPU tests of its shapes (with the
# untimed kernels' runs, SNAPMLA_TEST_UNTIMED=1), then the lab options' bench (lab/h200_lab_options.sh
# PARTS=bench) with VARIANTS; the narrow tile's variant (bnarrow) is left out if its tests failed.
#   [VARIANTS="folded late bnarrow ownpv"] [BENCH_ARGS="--rounds 3"] [STAMPS=1] lab/h200_narrow_then_bench.sh OUT_DIR
#   (carry .devbin, .whl, .peers)
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
filter='Shapes/*h1_*:Shapes/*h3_*:Shapes/*h8_*:Shapes/*h9_*:Shapes/*h16_sq1*:GpuErrors.NonFinite*'
SNAPMLA_TEST_UNTIMED=1 timeout "${TEST_TIMEOUT:-120}" .devbin/snapmla_gpu_tests --gtest_filter="$filter" \
  > "$dest/gpu_tests_bf16_narrow.log" 2>&1
rc=$?
echo "narrow tile's tests exit: $rc"
grep -E "narrow tile|^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$dest/gpu_tests_bf16_narrow.log" | head -30
skip=${SKIP_VARIANTS:-}
[ $rc -eq 0 ] || skip="$skip bnarrow"
PARTS=bench SKIP_VARIANTS="$skip" VARIANTS="${VARIANTS:-folded late bnarrow ownpv}" BENCH_ARGS="${BENCH_ARGS:---rounds 3}" \
  LIMIT=${LIMIT:-440} BUDGET=${BUDGET:-380} lab/h200_lab_options.sh "$dest"
# STAMPS=1: then the profiling build's per-CTA stamps at small batches (lab/h200_profile_small.sh,
# its CASES / SCALES), in what is left of STAMPS_TIMEOUT seconds (its Nsight Compute part last).
if [ -n "${STAMPS:-}" ]; then
  CASES=${CASES:-"1,128,1,8192 4,64,1,8192 2,16,1,8192 128,128,1,8192"} SCALES=${SCALES:-1} \
    timeout "${STAMPS_TIMEOUT:-110}" lab/h200_profile_small.sh "$dest" > "$dest/profile_small.log" 2>&1
  echo "stamps exit: $? (124: cut at the timeout)"
  tail -40 "$dest/profile_small.log"
fi
