#!/usr/bin/env bash
# One H200 call (device tool) for the decode kernels' lab options (first run at fc4dfc1: the
# consumers' broadcast role index then became the default, the per-thread one stays as
# SNAPMLA_ROLE_INDEX=thread): the 64-row tiles' base-2
# score step (SNAPMLA_SCORE_STEP=folded, both decodes), decode_bf16's own-page PV from registers
# (SNAPMLA_BF16_OWN_PV=registers), decode_bf16's page-A QK first (SNAPMLA_BF16_QK_ORDER=a_first),
# the combine folded into the decode kernels' tail
# (SNAPMLA_COMBINE_FUSED=1), the fp32 partials staged through shared memory (SNAPMLA_PARTIALS=staged),
# the late trigger of the programmatic combine (SNAPMLA_COMBINE_PDL=late), the 64-row tile on
# narrow calls (SNAPMLA_FP8_TILE=rows64_all), decode_bf16's narrow tile (SNAPMLA_BF16_TILE=narrow) and
# decode_fp8's three-consumer tile (SNAPMLA_FP8_TILE=trio; its tests: lab/h200_untimed_tiles.sh).
#  1. the GPU tests that cover them, with the untimed kernels' runs switched on
#     (SNAPMLA_TEST_UNTIMED=1) and a short timeout: a hang (an earlier draft of the score step
#     hung on a poisoned row) stops this part only;
#  2. memcheck on those tests' 64-row shapes under the untimed kernels;
#  3. `pip install .`, then the bench's sweep and grid with the options as same-run variants
#     (decode_bf16 under each of them too), and the kernel timeline at small batches (the
#     combine under =1 and =late beside the ordinary launch, the fused combine and the staged
#     partials); LENGTHS=1 adds the planner's split length at b = 1-8 under the late trigger and
#     under the fused combine with and without staged partials (lab/split_sweep.py --lengths --env).
#   [PARTS=tests|bench] [VARIANTS="thread fused ..."] [SKIP_VARIANTS="fused ..."] [BENCH_ARGS="--rounds 3"]
#   lab/h200_lab_options.sh [OUT_DIR]
#   (carry .devbin, .whl, .peers)
# The logs come back as OUT_DIR/h200_lab_options.tgz, the bench's files under OUT_DIR/results.
# The optional parts (LENGTHS, the kernel timeline) are skipped past BUDGET seconds (default 480),
# so that the archive is written inside the device's 600-second limit.
# Exit status: the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
out=$(mktemp -d /tmp/h200lab.XXXX)
trap 'tar czf "$dest/h200_lab_options.tgz" -C "$out" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
repo=$PWD
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# A part's timeout: its own (N seconds), cut to what is left before LIMIT (default 570) seconds.
cap() { local left=$(( ${LIMIT:-570} - ($(date +%s) - t0) )); [ "$left" -lt 1 ] && left=1; [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
# PARTS: which halves to run, `tests` (the GPU tests and memcheck under the options) and `bench`
# (pip install, the sweep and grid with the options as variants, the split lengths, the timeline);
# both by default. Two calls, PARTS=tests then PARTS=bench, give the bench the whole time limit.
part() { [[ ",${PARTS:-tests,bench}," == *",$1,"* ]]; }
within_budget() { [ $(( $(date +%s) - t0 )) -lt "${BUDGET:-480}" ] || { stamp "over BUDGET: $1 skipped"; return 1; }; }
failed=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee "$out/gpu.txt"

if part tests; then
  filter='Shapes/*:GpuErrors.NonFinite*:GpuDecodeGaussian*:GpuDecode.CombineLabOptions*:GpuDecode.UniformRoleIndex*'
  filter="$filter:GpuDecode.FusedCombine*:GpuErrors.FusedCombine*:GpuDecode.StagedPartials*:GpuErrors.BadArguments*"
  filter="$filter:GpuDecode.Bf16QkOrder*:GpuGraph.FusedCombine*"
  stamp "GPU tests with the untimed kernels' runs (SNAPMLA_TEST_UNTIMED=1)"
  SNAPMLA_TEST_UNTIMED=1 timeout $(cap ${TEST_TIMEOUT:-200}) .devbin/snapmla_gpu_tests --gtest_filter="$filter" \
    > "$out/gpu_tests_score_step.log" 2>&1
  rc=$?
  echo "gpu tests exit: $rc (124: timed out)"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[ RUN      \]" "$out/gpu_tests_score_step.log" | tail -3
  grep -E "tile 64f|decode_bf16 \((folded|own PV|page A|narrow)|UniformRoleIndex|FusedCombine|StagedPartials|Bf16QkOrder" \
    "$out/gpu_tests_score_step.log" | head -24
  [ $rc -eq 0 ] || failed=$((failed + 1))
  # decode_bf16's narrow tile under the whole C++ GPU suite: every decode_bf16 call of at most 16
  # rows runs it (bad inputs, graph replay, batch 1024, 256K tokens, the batch-invariant plans).
  stamp "the C++ GPU suite with SNAPMLA_BF16_TILE=narrow"
  SNAPMLA_BF16_TILE=narrow timeout $(cap ${TEST_TIMEOUT:-200}) .devbin/snapmla_gpu_tests \
    > "$out/gpu_tests_bf16_narrow.log" 2>&1
  rc=$?
  echo "gpu suite (bf16 narrow) exit: $rc"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/gpu_tests_bf16_narrow.log" | tail -8
  [ $rc -eq 0 ] || failed=$((failed + 1))
  # The GPU suite's Gaussian test (FlashMLA's per-element bounds on decode_bf16) under each option.
  # (The two role indices' bits are compared on many shapes above.)
  for opt in SNAPMLA_SCORE_STEP=folded SNAPMLA_BF16_OWN_PV=registers SNAPMLA_ROLE_INDEX=thread \
             SNAPMLA_BF16_QK_ORDER=a_first SNAPMLA_BF16_MAX_HANDOFF=early; do
    env "$opt" timeout $(cap 60) .devbin/snapmla_gpu_tests --gtest_filter='GpuDecodeGaussian*' \
      > "$out/gpu_tests_gaussian_${opt%%=*}.log" 2>&1 || failed=$((failed + 1))
    echo "Gaussian under $opt:"; grep -E "^\[  (PASSED|FAILED) " "$out/gpu_tests_gaussian_${opt%%=*}.log"
  done

  # memcheck LOG TIMEOUT FILTER [NAME=VALUE ...]: the GPU tests of FILTER under memcheck, with the
  # given settings of the environment.
  memcheck() {
    local log=$1 limit=$2 filter=$3
    shift 3
    env "$@" timeout "$(cap "$limit")" compute-sanitizer --tool memcheck --error-exitcode 9 \
      .devbin/snapmla_gpu_tests --gtest_filter="$filter" > "$out/$log" 2>&1
    local rc=$?
    echo "memcheck exit: $rc"
    grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$out/$log" | tail -3
    [ $rc -eq 0 ] || failed=$((failed + 1))
  }
  stamp "memcheck, 64-row shapes under the untimed kernels"
  memcheck memcheck_score_step.log "${SAN_TIMEOUT:-120}" 'Shapes/*h64*:Shapes/*h128*:GpuErrors.NonFinite*' \
    SNAPMLA_TEST_UNTIMED=1 SNAPMLA_TEST_FP8_TILE=64
  stamp "memcheck, the fused combine's and the staged partials' tests"
  memcheck memcheck_fused.log "${SAN_TIMEOUT:-120}" \
    'GpuDecode.FusedCombine*:GpuErrors.FusedCombine*:GpuGraph.FusedCombine*:GpuDecode.StagedPartials*' \
    SNAPMLA_TEST_UNTIMED=1
  stamp "memcheck, decode_bf16's narrow tile"
  memcheck memcheck_bf16_narrow.log "${SAN_TIMEOUT:-90}" \
    'Shapes/*h1_*:Shapes/*h3_*:Shapes/*h8_*:Shapes/*h9_*:Shapes/*h16_sq1*:GpuErrors.Bad*:GpuErrors.NonFinite*:GpuDecodeHeads*' \
    SNAPMLA_TEST_UNTIMED=1 SNAPMLA_BF16_TILE=narrow
  stamp "memcheck, narrow and 64-row shapes under the per-thread role index"
  memcheck memcheck_role_index.log "${SAN_TIMEOUT:-90}" 'Shapes/*h8_*:Shapes/*h128_sq1*:GpuErrors.NonFinite*' \
    SNAPMLA_ROLE_INDEX=thread
  # decode_bf16's page-A QK first adds a named-barrier hand-off: synccheck on its bits test.
  stamp "synccheck, decode_bf16 with page A's QK first"
  SNAPMLA_TEST_UNTIMED=1 timeout "$(cap "${SAN_TIMEOUT:-90}")" compute-sanitizer --tool synccheck --error-exitcode 9 \
    .devbin/snapmla_gpu_tests --gtest_filter='GpuDecode.Bf16QkOrder*' > "$out/synccheck_qk_order.log" 2>&1
  rc=$?
  echo "synccheck exit: $rc"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$out/synccheck_qk_order.log" | tail -3
  [ $rc -eq 0 ] || failed=$((failed + 1))

fi
if part bench; then
  stamp "pip install ."
  ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
  if python3 -m pip install --no-build-isolation --no-index --no-deps . > "$out/pip_install.log" 2>&1; then
    cd /tmp  # the installed package
    # wide16: the transposing 64-row tile on the narrow tile's calls too (h <= 16; the other cases
    # run the same kernels as the default, a measure of the run's noise). ownpv: decode_bf16's
    # own-page PV from registers (decode_fp8 runs its default there: noise again). thread: the
    # consumers' indices from threadIdx as they are (the former default).
    # staged: the fp32 partials through shared memory (the default 64-row kernels of both decodes).
    # qkfirst: decode_bf16's page-A QK first (decode_fp8 runs its default there: noise again).
    # fstaged: the fused combine with staged partials (the pair to make the default if both win);
    # fequal: the same on the planner's equal shares (the split length without the combine's price).
    # bnarrow: decode_bf16's narrow tile at h <= 16 (decode_fp8 runs its default there: noise).
    # trio: decode_fp8's three-consumer 64-row tile on the calls of more than 16 rows (decode_bf16
    # runs its default there: noise); triosf: the same in its other iteration order; triof: with the
    # base-2 score step. dpdl: every decode kernel launched as a programmatic dependent of the
    # kernel before it (the bench's graphs: the call before's combine or decode). bmax: decode_bf16's
    # early max hand-off (decode_fp8 runs its default there: noise); bmaxf: with the base-2 step;
    # bmaxr: with the owner's P from registers.
    # VARIANTS="thread fused ...": only those (each variant adds two graphs per case, so all
    # ten may not fit one call's time: split them over two PARTS=bench calls).
    # SKIP_VARIANTS="fused ...": leave those out (one whose tests failed in the PARTS=tests call:
    # a kernel that gives up waiting takes a second a call, which would eat the bench's time).
    # A variant of one decode's own option is timed on that decode alone (--env: decode_fp8,
    # --bf16-env: decode_bf16); one that reaches both (the score step, the launches, the combine,
    # the partials, the role index) on both.
    fp8_only=" wide16 trio triosf triof "
    bf16_only=" ownpv qkfirst bnarrow bmax bmaxf bmaxr "
    variants=""
    for v in folded:SNAPMLA_SCORE_STEP=folded late:SNAPMLA_COMBINE_PDL=late wide16:SNAPMLA_FP8_TILE=rows64_all \
             ownpv:SNAPMLA_BF16_OWN_PV=registers thread:SNAPMLA_ROLE_INDEX=thread fused:SNAPMLA_COMBINE_FUSED=1 \
             staged:SNAPMLA_PARTIALS=staged qkfirst:SNAPMLA_BF16_QK_ORDER=a_first \
             fstaged:SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PARTIALS=staged bnarrow:SNAPMLA_BF16_TILE=narrow \
             trio:SNAPMLA_FP8_TILE=trio triosf:SNAPMLA_FP8_TILE=trio,SNAPMLA_FP8_TRIO_ORDER=softmax_first \
             triof:SNAPMLA_FP8_TILE=trio,SNAPMLA_SCORE_STEP=folded dpdl:SNAPMLA_DECODE_PDL=1 \
             bmax:SNAPMLA_BF16_MAX_HANDOFF=early bmaxf:SNAPMLA_BF16_MAX_HANDOFF=early,SNAPMLA_SCORE_STEP=folded \
             bmaxr:SNAPMLA_BF16_MAX_HANDOFF=early,SNAPMLA_BF16_OWN_PV=registers \
             fequal:SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PARTIALS=staged,SNAPMLA_PLAN_SPLIT=equal; do
      [ -z "${VARIANTS:-}" ] || [[ " $VARIANTS " == *" ${v%%:*} "* ]] || continue
      [[ " ${SKIP_VARIANTS:-} " == *" ${v%%:*} "* ]] && continue
      [[ "$bf16_only" == *" ${v%%:*} "* ]] || variants="$variants --env $v"
      [[ "$fp8_only" == *" ${v%%:*} "* ]] || variants="$variants --bf16-env $v"
    done
    echo "bench variants: $variants"
    for what in sweep grid; do
      stamp "bench $what with the variants"
      args=--sweep
      [ $what = grid ] && args="--cases grid"
      # shellcheck disable=SC2086
      timeout $(cap ${BENCH_TIMEOUT:-240}) python3 -m snapmla.bench --peers "$repo/.peers" $args $variants \
        ${BENCH_ARGS:-} --out "$dest/results" > "$out/bench_$what.log" 2>&1
      echo "bench $what exit: $?"
      grep -E "^- " "$out/bench_$what.log" | head -20
    done
    # LENGTHS=1: the planner's split length at b = 1-8 under the late trigger too (a few minutes).
    if [ -n "${LENGTHS:-}" ] && within_budget "the split lengths"; then
      stamp "split lengths at b = 1-8: ordinary and late combine launch, fused combine (fragments, staged)"
      timeout $(cap ${LENGTHS_TIMEOUT:-240}) python3 "$repo/lab/split_sweep.py" --peers "$repo/.peers" --lengths \
        --env SNAPMLA_COMBINE_PDL=late SNAPMLA_COMBINE_FUSED=1 SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PARTIALS=staged \
        --out "$dest/results" > "$out/split_lengths_late.log" 2>&1
      echo "split lengths exit: $?"
      tail -32 "$out/split_lengths_late.log"
    fi
    if within_budget "the kernel timeline"; then
      stamp "kernel timeline (ordinary, =1 and =late combine launches, fused combine, staged partials, both)"
      timeout $(cap 120) python3 "$repo/lab/kernel_timeline.py" --peers "$repo/.peers" \
        --env SNAPMLA_COMBINE_PDL=1 SNAPMLA_COMBINE_PDL=late SNAPMLA_COMBINE_FUSED=1 SNAPMLA_PARTIALS=staged \
        SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PARTIALS=staged > "$out/kernel_timeline.log" 2>&1
      echo "kernel timeline exit: $?"
      tail -40 "$out/kernel_timeline.log"
    fi
  else
    tail -30 "$out/pip_install.log"
    failed=$((failed + 1))
  fi
fi
stamp "done: $failed part(s) failed"
exit $failed
