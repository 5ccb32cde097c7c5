#!/usr/bin/env bash
# One call on the H200 (device tool) that checks a change end to end: the C++ GPU suite from
# .devbin/ (built here with nvcc), memcheck and racecheck on the cases that run several splits
# per CTA, `pip install .` (wheels in .whl/) and the whole pytest suite, then a same-run bench
# (`python -m snapmla.bench --peers .peers`) on CASES (default: the batches the scheduler moves).
#   lab/h200_check.sh [OUT_DIR]     (default $OUT or /tmp/h200); SKIP=tests,sanitize,py,probe,bench skips parts
# PYTEST=files limits pytest to some files (e.g. "test_fastpath test_torch"); GDB_TEST=file runs that
# file under gdb for a backtrace of a crash; SWEEP=1 runs the bench's --sweep into OUT_DIR/results.
# GTEST_FILTER limits the C++ GPU suite; TEST_TIMEOUT / BENCH_TIMEOUT / SWEEP_TIMEOUT (s) bound it,
# the bench and the sweep. BENCH_ARGS go to the bench and the sweep (e.g. lab variants timed beside
# the default: "--carried --env wave:SNAPMLA_COMBINE_WAVE=batch").
# VREGS=1 also runs the V^T-register tile through the GPU tests that take the default tile
# (SNAPMLA_FP8_TILE=vregs), under memcheck and racecheck (SNAPMLA_TEST_FP8_TILE=v), and in the bench.
# The logs go to a work folder and come back as one archive, OUT_DIR/h200_logs.tgz (the device
# tool returns a few files only).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
out=$(mktemp -d /tmp/h200logs.XXXX)
trap 'tar czf "$dest/h200_logs.tgz" -C "$out" . 2>/dev/null' EXIT
skip=${SKIP:-}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
t0=$(date +%s)
[ -n "${VREGS:-}" ] && export SNAPMLA_TEST_VREGS=1
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee "$out/gpu.txt"
if [[ $skip != *tests* ]]; then
  stamp "C++ GPU suite"
  timeout ${TEST_TIMEOUT:-400} .devbin/snapmla_gpu_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} \
    > "$out/gpu_tests.log" 2>&1
  echo "gpu tests exit: $? (124: timed out)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error:" "$out/gpu_tests.log" | head -40
  if [ -n "${VREGS:-}" ]; then
    stamp "C++ GPU suite, default tile = vregs"
    SNAPMLA_FP8_TILE=vregs timeout ${VREGS_TIMEOUT:-200} .devbin/snapmla_gpu_tests --gtest_filter='-Shapes/*:GpuCacheOps*:GpuPlan*' \
      > "$out/gpu_tests_vregs.log" 2>&1
    echo "gpu tests (vregs) exit: $?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error:" "$out/gpu_tests_vregs.log" | head -40
  fi
fi
if [ -n "${VREGS:-}" ] && [[ $skip != *vsan* ]]; then
  stamp "vregs memcheck / racecheck"
  SNAPMLA_TEST_FP8_TILE=v SNAPMLA_FP8_TILE=vregs timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
    .devbin/snapmla_gpu_tests --gtest_filter='GpuErrors*:*_w1_*:*_w2_*:*_w3_*:GpuGraph*:GpuDecodeHeads*' \
    > "$out/memcheck_vregs.log" 2>&1
  echo "memcheck vregs exit: $?"; tail -3 "$out/memcheck_vregs.log"
  SNAPMLA_TEST_FP8_TILE=v timeout 200 compute-sanitizer --tool racecheck --print-limit 12 --error-exitcode 9 \
    .devbin/snapmla_gpu_tests --gtest_filter='*h128_sq1_w2_*:*h64_sq2_w1_*:*h126_sq1_w0_*' > "$out/racecheck_vregs.log" 2>&1
  echo "racecheck vregs exit: $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$out/racecheck_vregs.log" | tail -3
fi
if [[ $skip != *sanitize* ]]; then
  stamp "memcheck / racecheck / synccheck"
  lab/h200_sanitize.sh "$out"
fi
if [[ $skip != *py* || $skip != *bench* || -n "${SWEEP:-}" ]]; then
  stamp "pip install ."
  ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
  python3 -m pip install --no-build-isolation --no-index --no-deps . > "$out/pip_install.log" 2>&1 ||
    { tail -40 "$out/pip_install.log"; exit 1; }
fi
repo=$PWD
cd /tmp  # the installed package, not the source tree
if [[ $skip != *py* ]]; then
  stamp "pytest"
  # One process per file, so that a crash names its file (faulthandler prints the stack).
  for f in "$repo"/tests/python/test_*.py; do
    n=$(basename "$f" .py)
    [ -n "${PYTEST:-}" ] && [[ " $PYTEST " != *" $n "* ]] && continue
    python3 -X faulthandler -m pytest -q -rs -p no:cacheprovider "$f" > "$out/pytest.$n.log" 2>&1
    rc=$?
    echo "pytest $n exit: $rc $(tail -1 "$out/pytest.$n.log")"
    [ $rc -ne 0 ] && grep -E "Fatal Python error|File \"|Error|assert" "$out/pytest.$n.log" | head -30
  done
fi
if [ -n "${GDB_TEST:-}" ]; then
  stamp "gdb $GDB_TEST"
  if command -v gdb >/dev/null; then
    gdb -q -batch -ex run -ex bt -ex "info registers rip" --args python3 -m pytest -q -x -p no:cacheprovider \
      "$repo/tests/python/$GDB_TEST.py" > "$out/gdb.log" 2>&1
    grep -E "^#[0-9]|signal|SIG" "$out/gdb.log" | head -30
  else
    echo "no gdb here"; python3 -X faulthandler -m pytest -v -x -p no:cacheprovider "$repo/tests/python/$GDB_TEST.py" 2>&1 | tail -40
  fi
fi
if [[ $skip != *probe* ]]; then
  stamp "plan probe"
  python3 "$repo/lab/plan_probe.py" --peers "$repo/.peers" --out "$out" > "$out/plan_probe.log" 2>&1
  echo "plan probe exit: $?"; cat "$out/plan_probe.log" | tail -14
fi
if [[ $skip != *bench* ]]; then
  stamp "bench"
  # shellcheck disable=SC2086
  timeout ${BENCH_TIMEOUT:-300} python3 -m snapmla.bench --peers "$repo/.peers" ${VREGS:+--vregs} ${BENCH_ARGS:-} --cases ${CASES:-82,128,1,32768 46,128,1,32768 46,16,1,32768 1,128,1,8192 1,16,1,8192 8,128,1,8192 128,128,1,8192 20,128,1,8192 160,64,1,8192} \
    > "$out/bench.log" 2>&1
  echo "bench exit: $?"; grep -E "^b=" "$out/bench.log"
fi
if [ -n "${SWEEP:-}" ]; then
  stamp "sweep"
  # shellcheck disable=SC2086
  timeout ${SWEEP_TIMEOUT:-400} python3 -m snapmla.bench --peers "$repo/.peers" ${VREGS:+--vregs} ${BENCH_ARGS:-} --sweep \
    --out "$dest/results" > "$out/sweep.log" 2>&1
  echo "sweep exit: $?"; grep -vE "^b=" "$out/sweep.log" | tail -25
fi
stamp done
