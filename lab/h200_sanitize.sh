#!/usr/bin/env bash
# compute-sanitizer over the C++ GPU suite in .devbin/ (shared by h200_check.sh and h200_suite.sh):
# memcheck on the plan, error (plan tables outside their capacity among them), combine and
# multi-split cases (and, under SNAPMLA_TEST_UNTIMED=1, the lab lookups on a full plan);
# racecheck and synccheck on workers
# with several splits (the split boundary) and on the same kernels with one split per CTA, both
# tiles, shapes of 1-3 pages per split (longer splits add racecheck's known bar.arrive false
# positives, docs/design.md). Logs into OUT_DIR; each tool run is bounded by SAN_TIMEOUT (s).
#   lab/h200_sanitize.sh OUT_DIR        exit status: the number of runs that reported errors
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUT_DIR}
mkdir -p "$out"
bound=${SAN_TIMEOUT:-300}
failed=0
timeout "$bound" compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/snapmla_gpu_tests \
  --gtest_filter='GpuPlan*:GpuErrors*:GpuDecode.Combine*:*_w1_*:*_w2_*:*_w3_*:*h16_sq1_w40*:GpuGraph*' \
  > "$out/memcheck.log" 2>&1
rc=$?; echo "memcheck exit: $rc"; grep -E "ERROR SUMMARY" "$out/memcheck.log" | tail -1
[ $rc -eq 0 ] || failed=$((failed + 1))
# The lab lookups' reads on a plan filled to its capacity (SNAPMLA_PLAN_LOOKUP=window / search_l1:
# the test adds them to the default's under SNAPMLA_TEST_UNTIMED=1); a short run, at most 60 s.
SNAPMLA_TEST_UNTIMED=1 timeout "$(( bound < 60 ? bound : 60 ))" compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/snapmla_gpu_tests \
  --gtest_filter='GpuErrors.WindowLookup*' > "$out/memcheck_lookup.log" 2>&1
rc=$?; echo "memcheck (lab lookups) exit: $rc"; grep -E "ERROR SUMMARY" "$out/memcheck_lookup.log" | tail -1
[ $rc -eq 0 ] || failed=$((failed + 1))
for tool in racecheck synccheck; do
  for set in "multi:*h128_sq1_w2_*:*h64_sq2_w1_*:*h16_sq1_w3_*:*h8_sq4_w2_*" \
             "single:*h126_sq1_w0_*:*h8_sq2_w0_*:*h9_sq1_w32_*:*h16_sq1_w40_*"; do
    name=${set%%:*}
    timeout "$bound" compute-sanitizer --tool $tool --print-limit 12 --error-exitcode 9 .devbin/snapmla_gpu_tests \
      --gtest_filter="${set#*:}" > "$out/$tool.$name.log" 2>&1
    rc=$?; echo "$tool $name exit: $rc"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.$name.log" | tail -1
    [ $rc -eq 0 ] || failed=$((failed + 1))
  done
done
exit $failed
