#!/usr/bin/env bash
# One short device call for a change of defaults: the whole C++ GPU suite under the new defaults,
# then `pip install .` and the bench's sweep and grid with the peers and the former defaults as
# the same-run variant `old` (OLD_FP8 for decode_fp8, OLD_BF16 for decode_bf16, as --env and
# --bf16-env settings), into OUT_DIR/results (docs/results/h200_sweep.* and h200.* at this commit).
# Everything comes back as OUT_DIR/defaults_check.tgz plus the results' JSON.
# Its default variant `old` is the defaults before an H100's same-run sweep at c83482e made two
# changes, both the same bits as before: the plan's lookup in fewer rounds of loads with the plan's
# tables prefetched into L1 (SNAPMLA_PLAN_LOOKUP=window_l1; `old`: search) and decode_bf16's output
# rescale skipped where no running max moved (SNAPMLA_BF16_RESCALE=changed; `old`: always). (The
# five changes before those, timed as `old` on the H200 at 3178c1c and b416bc1 and on H100s: the
# programmatic decode launch, bf16 split partials on decode_fp8, the planner's piece cost of 8 and
# its workers counted on the cost axis, decode_bf16's narrow tile on calls of at most 16 rows at
# batches of at most 32; as OLD_FP8=SNAPMLA_DECODE_PDL=0,SNAPMLA_PARTIALS=fragments,
# SNAPMLA_PLAN_PIECE_COST=4,SNAPMLA_PLAN_WORKERS=blocks, OLD_BF16 the same plus
# SNAPMLA_BF16_TILE=rows64.)
# LAB_FP8 / LAB_BF16 (space-separated LABEL:NAME=VALUE,... settings) add lab options to the same run
# as further variants, once their bits tests (SNAPMLA_TEST_UNTIMED=1, LAB_TESTS) have passed: a
# failed test whose name holds one of a variant's LAB_OWN_TESTS words (LABEL=WORD ..., a label may
# have several) leaves that variant out, any other failure (or a time-out) all of them. By default,
# on both paths, the planner's piece cost by tile (`pct`, SNAPMLA_PLAN_PIECE_COST=tile: 4 above 16
# query rows; level on an H100 at c83482e, 1.000x the default's median time).
# (Timed and level, so no longer by default: the combine's late trigger
# `cpl:SNAPMLA_COMBINE_PDL=late`, decode_bf16's narrow tile at every batch `bn:SNAPMLA_BF16_TILE=narrow`,
# the former count of workers `blk:SNAPMLA_PLAN_WORKERS=blocks`, the window lookup without the L1
# prefetch `lkw:SNAPMLA_PLAN_LOOKUP=window`.)
# LAB_FP8= LAB_BF16= leaves them out.
#   SNAPMLA_COMMIT=... [OLD_FP8=NAME=VALUE,...] [OLD_BF16=...] [LAB_FP8=...] [LAB_BF16=...]
#   lab/h200_defaults_check.sh OUT_DIR   (carry .devbin, .whl, .peers; about five minutes; each bench part
#   is cut at BENCH_TIMEOUT seconds, default 200; BENCH_PARTS="sweep" leaves the grid out)
# shellcheck source=lab/round_start.sh
. "$(dirname "$0")/round_start.sh" "$@"
work=$(mktemp -d /tmp/defaults.XXXX)
trap 'tar czf "$dest/defaults_check.tgz" -C "$work" . 2>/dev/null; cp "$work"/results/*.json "$dest"/ 2>/dev/null' EXIT
old_fp8=${OLD_FP8:-SNAPMLA_PLAN_LOOKUP=search}
old_bf16=${OLD_BF16:-SNAPMLA_PLAN_LOOKUP=search,SNAPMLA_BF16_RESCALE=always}
lab_fp8=${LAB_FP8-pct:SNAPMLA_PLAN_PIECE_COST=tile}
lab_bf16=${LAB_BF16-pct:SNAPMLA_PLAN_PIECE_COST=tile}
lab_tests=${LAB_TESTS:-Shapes/*:GpuErrors.NonFinite*:GpuPlan.*PieceCost*}
lab_own_tests=${LAB_OWN_TESTS:-pct=PieceCost}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee "$work/gpu.txt"
stamp "the C++ GPU suite under the defaults"
timeout "${SUITE_TIMEOUT:-120}" .devbin/snapmla_gpu_tests > "$work/gpu_suite.log" 2>&1
echo "exit: $? (124: timed out)"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$work/gpu_suite.log" | tail -6
variants=(--env "old:$old_fp8" --bf16-env "old:$old_bf16")
if [ -n "$lab_fp8$lab_bf16" ]; then
  stamp "the lab options' bits tests (SNAPMLA_TEST_UNTIMED=1: $lab_tests)"
  SNAPMLA_TEST_UNTIMED=1 timeout "${LAB_TIMEOUT:-180}" .devbin/snapmla_gpu_tests --gtest_filter="$lab_tests" \
    > "$work/lab_tests.log" 2>&1
  rc=$?
  echo "exit: $rc (124: timed out)"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$work/lab_tests.log" | tail -6
  # The failed tests, and the variants they leave out (own_word LABEL: its word, or nothing).
  failed=$(grep -E "^\[  FAILED  \] [A-Za-z]" "$work/lab_tests.log" | awk '{print $4}' | sort -u)
  own_word() { for pair in $lab_own_tests; do [ "${pair%%=*}" = "$1" ] && echo "${pair#*=}"; done; }
  others=$failed
  for pair in $lab_own_tests; do others=$(echo "$others" | grep -v -- "${pair#*=}"); done
  keep() {  # LABEL:SETTINGS
    local word
    word=$(own_word "${1%%:*}")
    [ $rc -ne 124 ] && [ -z "$others" ] && { [ -z "$word" ] || ! echo "$failed" | grep -q -- "$word"; }
  }
  for v in $lab_fp8; do if keep "$v"; then variants+=(--env "$v"); else echo "left out: $v (decode_fp8)"; fi; done
  for v in $lab_bf16; do if keep "$v"; then variants+=(--bf16-env "$v"); else echo "left out: $v (decode_bf16)"; fi; done
fi
echo "bench variants: ${variants[*]}"
stamp "pip install ."
lab/h200_pip_install.sh "$work" || exit 1
cd /tmp || exit 1  # the installed package
for what in ${BENCH_PARTS:-sweep grid}; do
  stamp "bench $what, the former defaults as the variant old, and the lab options"
  args=--sweep
  [ $what = grid ] && args="--cases grid"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-200}" python3 -m snapmla.bench --peers "$repo/.peers" $args --rounds 3 \
    "${variants[@]}" --out "$work/results" > "$work/bench_$what.log" 2>&1
  echo "exit: $?"
  grep -E "^- " "$work/bench_$what.log" | head -16
done
stamp "done"
