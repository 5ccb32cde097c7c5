#!/usr/bin/env bash
# The suite's most telling parts in priority order, for a device call with little time left:
# 1. the C++ GPU suite (whole); 2. the untimed GPU tests named by UNTIMED_FILTER; 3. memcheck on
# MEMCHECK_FILTER (under SNAPMLA_TEST_UNTIMED=1); 4. `pip install .` (lab/h200_pip_install.sh) and
# the bench's sweep with the peers (.peers/) into OUT_DIR/results, BENCH_ARGS added; 5. the whole
# pytest suite. The logs are packed into OUT_DIR/h200_short_logs.tgz again after each part (a
# device call returns at most 8 files), so a call cut short still returns the parts before the
# cut. The full round is lab/h200_suite.sh.
#   lab/h200_short.sh [OUT_DIR]     (default $OUT or /tmp/h200)
# shellcheck source=lab/round_start.sh
. "$(dirname "$0")/round_start.sh" "$@"
logs=$(mktemp -d /tmp/h200short.XXXX)
pack() { tar czf "$dest/h200_short_logs.tgz" -C "$logs" .; }
trap pack EXIT
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
lab/h200_pip_install.sh "$logs" || { stamp "done: pip install failed"; exit $((failed + 1)); }
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
