#!/usr/bin/env bash
# One H200 call (device tool) for the combine's row tasks (SNAPMLA_COMBINE_ROWS=1, a lab option):
# the GPU test that holds every combine lab option to the same bits and the bad-value errors, the
# decode GPU tests against the reference and memcheck with the option on (every split decode then
# combines through it), `pip install .`, then the kernel timeline (each kernel's device time beside
# the peers', the option as the --env variant) and the batch sweep with the option as a variant,
# both in the same run as the peers.
#   lab/h200_combine_rows.sh [OUT_DIR]   (carry .devbin, .peers, .whl; about four minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
repo=$PWD
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
summary() { grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error:" "$1" | head -20; }
stamp "the combine options' bits, bad values"
timeout 90 .devbin/snapmla_gpu_tests --gtest_filter='GpuDecode.CombineLabOptionsGiveTheSameBits:GpuErrors.BadArguments*' \
  > "$dest/gpu_bits.log" 2>&1
echo "exit $?"; summary "$dest/gpu_bits.log"
stamp "decode GPU tests with SNAPMLA_COMBINE_ROWS=1"
SNAPMLA_COMBINE_ROWS=1 timeout 200 .devbin/snapmla_gpu_tests \
  --gtest_filter='Shapes/*:GpuDecodeEdges*:GpuDecode.*:GpuGraph*:GpuErrors*:GpuDecodeHeads*' > "$dest/gpu_rows.log" 2>&1
echo "exit $?"; summary "$dest/gpu_rows.log"
stamp "memcheck with SNAPMLA_COMBINE_ROWS=1"
SNAPMLA_COMBINE_ROWS=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/snapmla_gpu_tests \
  --gtest_filter='GpuErrors*:GpuDecode.Combine*:*_w1_*:*_w2_*:*_w3_*:*h16_sq1_w40*' > "$dest/memcheck_rows.log" 2>&1
echo "exit $?"; grep -E "ERROR SUMMARY" "$dest/memcheck_rows.log" | tail -1
stamp "pip install ."
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
python3 -m pip install --no-build-isolation --no-index --no-deps . > "$dest/pip_install.log" 2>&1 ||
  { tail -20 "$dest/pip_install.log"; exit 1; }
cd /tmp  # the installed package
stamp "kernel timeline (the option as the --env variant)"
timeout 120 python3 "$repo/lab/kernel_timeline.py" --peers "$repo/.peers" --env SNAPMLA_COMBINE_ROWS=1 \
  --cases ${CASES:-4,64,1,8192 64,64,1,8192 100,64,1,8192 46,128,1,8192 82,128,1,32768 1,128,1,8192} \
  2>&1 | grep -v -i warn | tee "$dest/timeline_rows.log" | tail -40
stamp "the sweep with the option as a variant"
timeout 200 python3 -m snapmla.bench --peers "$repo/.peers" --sweep --env rows:SNAPMLA_COMBINE_ROWS=1 \
  --out "$dest/results" > "$dest/sweep_rows.log" 2>&1
echo "exit $?"; grep -E "^- " "$dest/sweep_rows.log" | head -4
stamp "done"
