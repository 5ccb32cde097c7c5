#!/usr/bin/env bash
# One device call for SNAPMLA_FAST_SMS (a lab option): the whole C++ GPU suite and the option's GPU
# tests (SNAPMLA_TEST_UNTIMED=1); then which SMs of this GPU stream faster (the profiling build's
# dump at b = 128, h = 16, 32K: lab/h200_sm_balance.sh, lab/sm_balance.py --fast-sms 1.12); then the
# product build and the bench's sweep and grid with the peers and the option as same-run variants
# (`fsm`: those SMs at the default weight; `pc4` and `fsmpc4`: with and without the former piece cost of 4).
#   SNAPMLA_COMMIT=... lab/h200_fast_sms.sh OUT   (carry .devbin, .whl, .peers; about five minutes)
. "$(dirname "$0")/round_start.sh" "$@"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
stamp "the C++ GPU suite"
timeout "${SUITE_TIMEOUT:-120}" .devbin/snapmla_gpu_tests > "$dest/gpu_suite.log" 2>&1
echo "exit: $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$dest/gpu_suite.log" | tail -6
stamp "the option's tests (SNAPMLA_TEST_UNTIMED=1)"
SNAPMLA_TEST_UNTIMED=1 timeout 150 .devbin/snapmla_gpu_tests --gtest_filter="${LAB_FILTER:-GpuDecode.FastSm*:GpuPlan.*}" \
  > "$dest/lab_tests.log" 2>&1
rc=$?
echo "exit: $rc"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$dest/lab_tests.log" | tail -6
[ $rc -eq 0 ] || exit 1
stamp "which SMs stream faster"
CASES=${PROBE_CASES:-128,16,1,32768} lab/h200_sm_balance.sh "$dest/probe" > "$dest/probe.log" 2>&1
grep -E "balanced by rate|correlation" "$dest/probe/sm_balance.txt"
fast=$(python3 lab/sm_balance.py "$dest/probe/sm_balance.csv" --fast-sms "${FAST_RATIO:-1.12}")
echo "fast SMs: $fast ($(echo "$fast" | tr '+' '\n' | grep -c .))"
[ -n "$fast" ] || { echo "no SM streams faster: nothing to time"; exit 0; }
stamp "pip install . (the product build)"
lab/h200_pip_install.sh "$dest" || exit 1
cd /tmp || exit 1
variants=(--env "fsm:SNAPMLA_FAST_SMS=$fast" --env "pc4:SNAPMLA_PLAN_PIECE_COST=4"
          --env "fsmpc4:SNAPMLA_FAST_SMS=$fast,SNAPMLA_PLAN_PIECE_COST=4")
for what in sweep grid; do
  stamp "bench $what"
  args=--sweep
  [ $what = grid ] && args="--cases grid"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-150}" python3 -m snapmla.bench --peers "$repo/.peers" $args --rounds 3 "${variants[@]}" \
    --out "$dest/results" > "$dest/bench_$what.log" 2>&1
  echo "exit: $?"
  grep -E "^- variant|^- decode_fp8 vs" "$dest/bench_$what.log" | head -8
done
cp "$dest"/results/*.json "$dest"/ 2>/dev/null
stamp "done"
