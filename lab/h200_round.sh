#!/usr/bin/env bash
# One round on the H200 (device tool): binaries built here are carried in .devbin/.
#   lab/h200_round.sh tests|sanitize|bench|quick|ncu|compare|stamps [commit]
# compare: .devbin/snapmla and every .devbin/snapmla_<name> build (e.g. main and a lab build) timed on
# COMPARE_CASES (default b=128, 8K, h=128/64/16/8), interleaved over $ROUNDS rounds (default 2) in this one run. stamps: every
# .devbin/snapmla_st<name> build (configured with -DCMAKE_CUDA_FLAGS=-DSNAPMLA_STAMPS) prints one
# CTA's clock64 stamps at each h.
# Writes logs under $OUT (the device tool brings them back) or /tmp/h200 when run elsewhere.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-tests}
commit=${2:-unknown}
out=${OUT:-/tmp/h200}
mkdir -p "$out"
bin=.devbin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$out/gpu.txt"
"$bin/snapmla" info
case "$mode" in
  tests)
    "$bin/snapmla_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" | grep -E "info|FAILED|PASSED|SKIPPED|Failure|error" | head -80
    ;;
  sanitize)
    lab/h200_sanitize.sh "$out"
    ;;
  sass)
    cuobjdump --dump-sass "$bin/snapmla_gpu_tests" > "$out/sass.txt" 2>&1
    for k in decode_fp8_kernel decode_bf16_kernel; do
      echo "$k: $(awk -v k="$k" '/Function :/ {f = index($0, k) > 0} f' "$out/sass.txt" | grep -oE 'QGMMA|HGMMA|HMMA|LDL|STL' | sort | uniq -c | tr '\n' ' ')"
    done
    ;;
  ncu)
    # One decode_fp8 launch (NCU_CASE, default b=128, h=64, s_k=8192; the 64-row tile that
    # SNAPMLA_FP8_TILE picks): the full section set with source-level warp-stall sampling, as a
    # details page and a per-SASS-instruction CSV (lab/ncu_regions.py sums the CSV's samples by
    # code region).
    tag=${commit}_${SNAPMLA_FP8_TILE:-default}
    ncu --set full --import-source yes -o "$out/decode_fp8_$tag" --kernel-name regex:'decode_fp8.*kernel' \
      --launch-skip 5 --launch-count 1 "$bin/snapmla" bench --reps 3 --case "${NCU_CASE:-128,64,1,8192}" > "$out/ncu_run_$tag.txt" 2>&1
    ncu -i "$out/decode_fp8_$tag.ncu-rep" --page details > "$out/ncu_decode_fp8_$tag.txt" 2>&1
    ncu -i "$out/decode_fp8_$tag.ncu-rep" --page source --csv --print-source sass > "$out/ncu_source_$tag.csv" 2>&1
    rm -f "$out/decode_fp8_$tag.ncu-rep"
    grep -E "Duration|Executed Ipc Active|DRAM Throughput" "$out/ncu_decode_fp8_$tag.txt"
    ;;
  compare)
    for r in $(seq "${ROUNDS:-2}"); do
      for b in "$bin"/snapmla "$bin"/snapmla_*; do
        [ -x "$b" ] || continue
        case "$b" in *_st*|*_tests) continue ;; esac  # test binaries are not builds of the CLI
        echo "== ${b##*/} round $r"
        # shellcheck disable=SC2046
        "$b" bench --reps 10 $(for c in ${COMPARE_CASES:-128,128,1,8192 128,64,1,8192 128,16,1,8192 128,8,1,8192}; do
          echo --case "$c"; done) 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ "
      done
    done 2>&1 | tee "$out/compare.log"
    ;;
  stamps)
    for b in "$bin"/snapmla_st*; do
      for h in 128 64 16; do
        echo "== ${b##*/} h=$h"
        "$b" bench --reps 3 --case 128,$h,1,8192 2>&1 | grep -E "role|^ +128"
      done
    done 2>&1 | tee "$out/stamps.log"
    ;;
  quick)
    "$bin/snapmla" bench --quick --reps 10 --commit "$commit" 2>&1 | tee "$out/bench_quick.log"
    ;;
  bench)
    "$bin/snapmla" bench --passes "${PASSES:-3}" --commit "$commit" --json "$out/h200.json" --md "$out/h200.md" 2>&1 | tee "$out/bench.log"
    ;;
esac
