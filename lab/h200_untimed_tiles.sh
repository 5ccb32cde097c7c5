#!/usr/bin/env bash
# The kernels not yet run on the H200 (run on an H100 at 80f852a-93ccb35), for one or two device
# calls: decode_bf16's narrow tile (SNAPMLA_BF16_TILE=narrow, bench variant `bnarrow`), the decodes'
# programmatic launch (SNAPMLA_DECODE_PDL=1, `dpdl`), decode_fp8's three-consumer 64-row tile
# (SNAPMLA_FP8_TILE=trio, bench variants `trio`, `triosf` in its other iteration order and `triof`
# with the base-2 score step) and decode_bf16's early max hand-off (SNAPMLA_BF16_MAX_HANDOFF=early,
# `bmax`; `bmaxf` with the base-2 score step).
#   PARTS=tests: each tile on the GPU tests of its shapes beside the default (SNAPMLA_TEST_UNTIMED=1,
#     short timeouts: a hang stops that part only), the whole C++ GPU suite with the tile as the
#     environment's choice (bad inputs, graph replay, batch 1024, 256K tokens, the plans), then
#     memcheck and racecheck on a few of its shapes. The variants whose tests failed are written
#     to OUT_DIR/failed_variants.
#   PARTS=bench: the lab options' bench (lab/h200_lab_options.sh PARTS=bench) with VARIANTS, less
#     SKIP_VARIANTS and the failed ones of this call; STAMPS=1 adds the small-batch stamps.
#   PARTS=gate: the variants' bits tests alone, run at once (a couple of minutes), for a call
#     that gates the bench in the same call (PARTS=gate,bench).
#   tests and bench by default (the bench then gets what is left of LIMIT).
#   [PARTS=gate|tests|bench] [VARIANTS="bnarrow dpdl trio"] [SKIP_VARIANTS=...] [STAMPS=1]
#   (the bench writes results/h200_sweep.partial.json as it goes: a sweep cut at its timeout keeps
#   its cases)
#   lab/h200_untimed_tiles.sh OUT_DIR      (carry .devbin, .whl, .peers)
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cap() { local left=$(( ${LIMIT:-560} - ($(date +%s) - t0) )); [ "$left" -lt 1 ] && left=1; [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
part() { [[ ",${PARTS:-tests,bench}," == *",$1,"* ]]; }  # gate runs only when named
failed_variants=""
fail_variant() {
  local v
  for v in $1 $([ "$1" = trio ] && echo triosf triof) $([ "$1" = bmax ] && echo bmaxf bmaxr); do  # and its other variants
    [[ " $failed_variants " == *" $v "* ]] || failed_variants="$failed_variants $v"
  done
}
# run LOG TIMEOUT VARIANT [NAME=VALUE ...] -- ARGS: the GPU test binary under the settings; a
# non-zero exit within the part's own TIMEOUT marks VARIANT as failed. A part cut short by the
# call's LIMIT (or not started: under 10 s left) is reported as such and marks nothing, so that a
# tight call does not drop a variant from the bench for want of time.
run() {
  local log=$1 limit=$2 variant=$3
  shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local given
  given=$(cap "$limit")
  if [ "$given" -lt 10 ] && [ "$limit" -ge 10 ]; then
    echo "$log: not run (the call's time is spent)"
    return 0
  fi
  env "${envs[@]}" timeout "$given" "$@" > "$dest/$log" 2>&1
  local rc=$?
  echo "$log exit: $rc (124: timed out)"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$dest/$log" | tail -6
  if [ $rc -eq 124 ] && [ "$given" -lt "$limit" ]; then
    echo "$log: cut at the call's LIMIT after ${given} s (not counted as a failure)"
    return 0
  fi
  [ $rc -eq 0 ] || fail_variant "$variant"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee "$dest/gpu.txt"
bin=.devbin/snapmla_gpu_tests

# PARTS=gate: each variant's bits tests only (no sanitizers, no whole suite), all at once on the
# one GPU (they check bits, not time; the CPU reference runs on the host's cores), so that a
# bench in the same call leaves out a variant that fails or hangs. A variant that passes here
# still needs the tests part (the whole suite under it, the sanitizers) before it is a default.
if part gate; then
  narrow_gate='Shapes/*h1_*:Shapes/*h3_*:Shapes/*h8_*:Shapes/*h9_*:Shapes/*h16_sq1*:GpuErrors.NonFinite*'
  stamp "the variants' bits tests, at once (each under ${GATE_TIMEOUT:-150} s)"
  gate_job() {  # VARIANT LOG [NAME=VALUE ...] -- ARGS: writes LOG and LOG.rc
    local variant=$1 log=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout "$(cap "${GATE_TIMEOUT:-150}")" "$@" > "$dest/$log" 2>&1
    echo "$? $variant" > "$dest/$log.rc"
  }
  gate_job bnarrow gate_bnarrow.log SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_PDL_TILES=bnarrow -- $bin \
    --gtest_filter="$narrow_gate:GpuDecode.ProgrammaticLaunch*" &
  gate_job trio gate_trio.log SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_PDL_TILES=trio -- $bin \
    --gtest_filter='Shapes/*:GpuErrors.NonFinite*:GpuDecode.ProgrammaticLaunch*' &
  gate_job bmax gate_bmax.log SNAPMLA_TEST_UNTIMED=1 -- $bin --gtest_filter='GpuDecode.Bf16MaxHandOff*' &
  gate_job dpdl gate_dpdl.log SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_PDL_TILES=verified -- $bin \
    --gtest_filter='GpuDecode.ProgrammaticLaunch*' &
  wait
  for rc_file in "$dest"/gate_*.log.rc; do
    read -r rc variant < "$rc_file"
    log=${rc_file%.rc}
    echo "$(basename "$log") exit: $rc (124: timed out)"
    grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$log" | tail -6
    rm -f "$rc_file"
    [ "$rc" -eq 0 ] || fail_variant "$variant"
  done
  grep -hE "tile 64x3|narrow tile" "$dest"/gate_trio.log "$dest"/gate_bnarrow.log | head -12
  stamp "gate done; failed variants:${failed_variants:- none}"
  echo "$failed_variants" > "$dest/failed_variants"
fi

if part tests; then
  narrow='Shapes/*h1_*:Shapes/*h3_*:Shapes/*h8_*:Shapes/*h9_*:Shapes/*h16_sq1*:GpuErrors.NonFinite*'
  stamp "decode_bf16's narrow tile: its shapes' tests"
  run bf16_narrow_tests.log 120 bnarrow SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_PDL_TILES=bnarrow -- $bin \
    --gtest_filter="$narrow:GpuDecode.ProgrammaticLaunch*"
  grep -E "narrow tile" "$dest/bf16_narrow_tests.log" | head -8
  # The three-consumer tile on every shape beside the default tiles (tile "64x3" in the log), and
  # on the non-finite inputs; then alone (SNAPMLA_TEST_FP8_TILE=3) under the sanitizers.
  stamp "decode_fp8's three-consumer tile: the shapes' and non-finite inputs' tests"
  run trio_tests.log 150 trio SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_PDL_TILES=trio -- $bin \
    --gtest_filter='Shapes/*:GpuErrors.NonFinite*:GpuDecode.ProgrammaticLaunch*'
  grep -E "tile 64x3" "$dest/trio_tests.log" | head -12
  stamp "decode_bf16's early max hand-off: the default's bits, then racecheck and synccheck on it"
  run bf16_max_tests.log 90 bmax SNAPMLA_TEST_UNTIMED=1 -- $bin --gtest_filter='GpuDecode.Bf16MaxHandOff*'
  run racecheck_bf16_max.log "${SAN_TIMEOUT:-60}" bmax SNAPMLA_BF16_MAX_HANDOFF=early SNAPMLA_TEST_FP8_TILE=16 -- \
    compute-sanitizer --tool racecheck --error-exitcode 9 $bin --gtest_filter='Shapes/*h128_sq1_w2_*:Shapes/*h64_sq2_w1_*'
  run synccheck_bf16_max.log "${SAN_TIMEOUT:-60}" bmax SNAPMLA_BF16_MAX_HANDOFF=early SNAPMLA_TEST_FP8_TILE=16 -- \
    compute-sanitizer --tool synccheck --error-exitcode 9 $bin --gtest_filter='Shapes/*h128_sq1_w2_*'
  stamp "the decodes' programmatic launch: the same bits after a kernel that rewrites the query"
  run decode_pdl_tests.log 90 dpdl SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_PDL_TILES=verified -- $bin \
    --gtest_filter='GpuDecode.ProgrammaticLaunch*'
  for tile in bnarrow:SNAPMLA_BF16_TILE=narrow trio:SNAPMLA_FP8_TILE=trio; do
    stamp "the C++ GPU suite with ${tile#*:}"
    run "gpu_suite_${tile%%:*}.log" "${SUITE_TIMEOUT:-150}" "${tile%%:*}" "${tile#*:}" -- $bin
  done
  stamp "memcheck / racecheck, the three-consumer tile"
  run memcheck_trio.log "${SAN_TIMEOUT:-90}" trio SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_FP8_TILE=3 -- \
    compute-sanitizer --tool memcheck --error-exitcode 9 $bin \
    --gtest_filter='Shapes/*h128_sq1_w2_*:Shapes/*h64_sq2_w1_*:Shapes/*h126_sq1_w0_*:GpuErrors.NonFinite*'
  run racecheck_trio.log "${SAN_TIMEOUT:-90}" trio SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_FP8_TILE=3 -- \
    compute-sanitizer --tool racecheck --error-exitcode 9 $bin \
    --gtest_filter='Shapes/*h128_sq1_w2_*:Shapes/*h64_sq2_w1_*'
  run synccheck_trio.log "${SAN_TIMEOUT:-60}" trio SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_FP8_TILE=3 -- \
    compute-sanitizer --tool synccheck --error-exitcode 9 $bin --gtest_filter='Shapes/*h128_sq1_w2_*'
  run racecheck_trio_softmax_first.log "${SAN_TIMEOUT:-60}" trio SNAPMLA_TEST_FP8_TILE=3 \
    SNAPMLA_FP8_TILE=trio SNAPMLA_FP8_TRIO_ORDER=softmax_first -- \
    compute-sanitizer --tool racecheck --error-exitcode 9 $bin --gtest_filter='Shapes/*h128_sq1_w2_*'
  stamp "memcheck, decode_bf16's narrow tile"
  run memcheck_bf16_narrow.log "${SAN_TIMEOUT:-90}" bnarrow SNAPMLA_TEST_UNTIMED=1 SNAPMLA_BF16_TILE=narrow -- \
    compute-sanitizer --tool memcheck --error-exitcode 9 $bin --gtest_filter="$narrow"
  echo "failed variants:${failed_variants:- none}"
  echo "$failed_variants" > "$dest/failed_variants"
fi

if part bench; then
  PARTS=bench SKIP_VARIANTS="${SKIP_VARIANTS:-} $failed_variants" VARIANTS="${VARIANTS:-bnarrow dpdl trio}" \
    BENCH_ARGS="${BENCH_ARGS:---rounds 3}" LIMIT=$(cap "${BENCH_LIMIT:-440}") BUDGET=${BUDGET:-380} \
    lab/h200_lab_options.sh "$dest"
  if [ -n "${STAMPS:-}" ]; then
    CASES=${CASES:-"1,128,1,8192 4,64,1,8192 2,16,1,8192 16,16,1,32768 128,128,1,8192"} SCALES=${SCALES:-1} \
      timeout "$(cap "${STAMPS_TIMEOUT:-110}")" lab/h200_profile_small.sh "$dest" > "$dest/profile_small.log" 2>&1
    echo "stamps exit: $? (124: cut at the timeout)"
    tail -40 "$dest/profile_small.log"
  fi
fi
