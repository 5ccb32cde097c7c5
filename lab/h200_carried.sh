#!/usr/bin/env bash
# One H200 call (device tool) for the carried P' scales (Fp8PScale::kCarried, a lab option):
# decode_fp8's GPU tests against the reference (MatchesTheCpuEmulation runs the 64-row tile with
# the carried scales beside the per-page ones), the bad-input, graph, edge and padding tests with
# the carried scales as the default (SNAPMLA_FP8_P_SCALE=carried), racecheck on shapes of 1-3
# pages per split (on longer ones racecheck reports its known false positives on the bar.arrive
# hand-offs, docs/archive/kernel_history.md), then
# `pip install .` and the bench with --carried in the same run as the peers: the bench's data
# (nearly flat attention) and peakier queries (--q-gain), where fewer pages keep their sigma.
#   lab/h200_carried.sh [OUT_DIR]   (carry .devbin, .peers, .whl; CASES / PEAKY_CASES override)
. "$(dirname "$0")/round_start.sh" "$@"
summary() { grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error:" "$1" | head -30; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
stamp "GPU tests: decode_fp8 against the reference (per-page and carried)"
timeout ${TEST_TIMEOUT:-150} .devbin/snapmla_gpu_tests --gtest_filter='Shapes/*:GpuErrors.BadArguments*' \
  > "$dest/gpu_shapes.log" 2>&1
echo "exit $?"; summary "$dest/gpu_shapes.log"
grep -E "tile 64c\)" "$dest/gpu_shapes.log" | head -8
stamp "GPU tests with SNAPMLA_FP8_P_SCALE=carried"
SNAPMLA_FP8_P_SCALE=carried timeout 120 .devbin/snapmla_gpu_tests \
  --gtest_filter='GpuErrors*:GpuGraph*:GpuDecodeEdges*:GpuDecodeHeads*:GpuDecode.LongSequence*:GpuDecodeGaussian*:-GpuErrors.BadArguments*' \
  > "$dest/gpu_carried.log" 2>&1
echo "exit $?"; summary "$dest/gpu_carried.log"
stamp "racecheck (carried)"
SNAPMLA_TEST_FP8_TILE=64 timeout 120 compute-sanitizer --tool racecheck --print-limit 12 --error-exitcode 9 \
  .devbin/snapmla_gpu_tests --gtest_filter='*h126_sq1_w0_*:*h8_sq2_w0_*:*h9_sq1_w32_*' > "$dest/racecheck.log" 2>&1
echo "exit $?"; grep -E "RACECHECK SUMMARY|hazard|FAILED" "$dest/racecheck.log" | head -5
stamp "pip install ."
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
python3 -m pip install --no-build-isolation --no-index --no-deps . > "$dest/pip_install.log" 2>&1 ||
  { tail -30 "$dest/pip_install.log"; exit 1; }
repo=$PWD
cd /tmp
stamp "bench --carried (the bench's data)"
# shellcheck disable=SC2086
timeout ${BENCH_TIMEOUT:-200} python3 -m snapmla.bench --peers "$repo/.peers" --carried --rounds 3 --cases \
  ${CASES:-128,128,1,8192 128,64,1,8192 128,16,1,8192 128,128,2,8192 32,128,1,65536 128,128,1,U 128,128,1,1024 82,128,1,32768 1,128,1,8192} \
  2>&1 | tee "$dest/bench.log" | grep -E "^b="
stamp "bench --carried --q-gain 30 (peakier attention)"
# shellcheck disable=SC2086
timeout 100 python3 -m snapmla.bench --peers "$repo/.peers" --carried --rounds 3 --q-gain 30 --cases \
  ${PEAKY_CASES:-128,128,1,8192 128,64,1,8192 32,128,1,65536} 2>&1 | tee "$dest/bench_peaky.log" | grep -E "^b="
stamp done
