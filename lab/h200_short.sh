#!/usr/bin/env bash
# The suite's most telling parts in priority order, for a device call with little time left: each
# part's log lands in OUT_DIR as it ends, so a call cut short still returns the parts before the
# cut. 1. the C++ GPU suite (whole); 2. the untimed GPU tests named by UNTIMED_FILTER; 3. memcheck on
# MEMCHECK_FILTER (under SNAPMLA_TEST_UNTIMED=1); 4. `pip install .` and the bench's sweep with the
# peers (.peers/) into OUT_DIR/results, BENCH_ARGS added; 5. the whole pytest suite. The full round
# is lab/h200_suite.sh. The logs are packed again into OUT_DIR/h200_short_logs.tgz after each part
# (a device call returns at most 8 files).
#   lab/h200_short.sh [OUT_DIR]     (default $OUT or /tmp/h200_short)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
dest=${1:-${OUT:-/tmp/h200_short}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
logs=$(mktemp -d /tmp/h200short.XXXX)
pack() { tar czf "$dest/h200_short_logs.tgz" -C "$logs" .; }
trap pack EXIT
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
failed=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$logs/gpu.txt"
summary() { grep -E "^\[  FAILED  \]|^\[==========\] [0-9]+ tests|^\[  PASSED  \]" "$1" | head -12; }
stamp "snapmla_gpu_tests (whole)"
timeout "${GPU_TIMEOUT:-150}" .devbin/snapmla_gpu_tests > "$logs/snapmla_gpu_tests.log" 2>&1
rc=$?; echo "snapmla_gpu_tests exit: $rc"; summary "$logs/snapmla_gpu_tests.log"; [ $rc -eq 0 ] || failed=$((failed + 1)); pack
if [ -n "${UNTIMED_FILTER:-}" ]; then
  stamp "untimed GPU tests: $UNTIMED_FILTER"
  SNAPMLA_TEST_UNTIMED=1 timeout 90 .devbin/snapmla_gpu_tests --gtest_filter="$UNTIMED_FILTER" > "$logs/untimed.log" 2>&1
  rc=$?; echo "untimed exit: $rc"; summary "$logs/untimed.log"; [ $rc -eq 0 ] || failed=$((failed + 1)); pack
fi
if [ -n "${MEMCHECK_FILTER:-}" ]; then
  stamp "memcheck: $MEMCHECK_FILTER"
  SNAPMLA_TEST_UNTIMED=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/snapmla_gpu_tests \
    --gtest_filter="$MEMCHECK_FILTER" > "$logs/memcheck.log" 2>&1
  rc=$?; echo "memcheck exit: $rc"; grep -E "ERROR SUMMARY" "$logs/memcheck.log" | tail -1; [ $rc -eq 0 ] || failed=$((failed + 1)); pack
fi
stamp "pip install ."
ls .whl/*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
if ! python3 -m pip install --no-build-isolation --no-index --no-deps . > "$logs/pip_install.log" 2>&1; then
  tail -20 "$logs/pip_install.log"; stamp "done: pip install failed"; exit $((failed + 1))
fi
cd /tmp || exit 1  # the installed package, not the source tree
if [ -d "$repo/.peers" ]; then
  stamp "bench sweep, with the peers"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-200}" python3 -m snapmla.bench --peers "$repo/.peers" --sweep ${BENCH_ARGS:-} \
    --out "$dest/results" > "$logs/bench_sweep.log" 2>&1
  echo "bench sweep exit: $?"; grep -E "^- " "$logs/bench_sweep.log" | head -24; pack
fi
stamp "pytest (whole suite, one process)"
timeout "${PYTEST_TIMEOUT:-300}" python3 -X faulthandler -m pytest -q -rs -p no:cacheprovider "$repo/tests/python" \
  > "$logs/pytest.log" 2>&1
rc=$?; echo "pytest exit: $rc"; tail -1 "$logs/pytest.log"
grep -E "^(FAILED|ERROR) |Fatal Python error" "$logs/pytest.log" | head -20; [ $rc -eq 0 ] || failed=$((failed + 1)); pack
stamp "done: $failed part(s) failed"
exit $failed
