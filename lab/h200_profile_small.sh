#!/usr/bin/env bash
# One H200 call (device tool): where a decode_fp8 CTA's time goes at small batches, the gap to
# the FP8 fork there being in the decode kernel itself. Installs the package as the profiling
# build (SNAPMLA_PROFILE_STAMPS=ON: decode_fp8's tiles stamp their CTAs' milestones and
# prints a report for one call, src/kernels/sm90/decode/profile_stamps.cuh), then for each case
# and split length (lab/launch_profile.py --rows-scale: 0.5 gives b = 1, h = 128, 8K two-page
# splits on all 132 CTAs, 1 the planner's four-page splits on 64) prints the report of the 4th
# call; then Nsight Compute's full set with source-level samples on one launch of the product
# CLI at b = 1, h = 128, 8K (lab/h200_round.sh ncu). The profiling package stays installed: a
# later call that needs the product package reinstalls it. The small cases (LOOKUP_CASES) run once more
# under each of LOOKUP_ENVS (by default the former lookup SNAPMLA_PLAN_LOOKUP=search and the window
# without the L1 prefetch, =window): how far the default moved the "work known" milestone up.
#   lab/h200_profile_small.sh [OUT_DIR]   (carry .devbin, .whl, .peers; about two minutes)
. "$(dirname "$0")/round_start.sh" "$@"
stamp "pip install . (profiling build)"
PROFILE=1 lab/h200_pip_install.sh "$dest" || exit 1
cd /tmp || exit 1  # the installed package
stamp "stamps per case"
cases="1,128,1,8192 2,128,1,8192 4,128,1,8192 8,128,1,8192 1,64,1,8192 4,64,1,8192 128,128,1,8192"
cases="$cases 4,16,1,8192 16,16,1,8192 16,16,1,32768"
for c in ${CASES:-$cases}; do
  for k in ${SCALES:-1 0.5}; do
    SNAPMLA_PROFILE_CALL=4 timeout 60 python3 "$repo/lab/launch_profile.py" --peers "$repo/.peers" \
      --case "$c" --calls 5 --rows-scale "$k" 2>&1 | grep -v -i warn
  done
done | tee "$dest/stamps_small.log"
# The small cases again under each setting of LOOKUP_ENVS (NAME=VALUE): the former search, then the
# window lookup without the plan's tables in L1 (SNAPMLA_PLAN_LOOKUP; the default is window_l1).
for setting in ${LOOKUP_ENVS:-SNAPMLA_PLAN_LOOKUP=search SNAPMLA_PLAN_LOOKUP=window}; do
  stamp "stamps under $setting"
  for c in ${LOOKUP_CASES:-1,128,1,8192 4,128,1,8192 4,64,1,8192 4,16,1,8192 128,128,1,8192}; do
    env "$setting" SNAPMLA_PROFILE_CALL=4 timeout 60 python3 "$repo/lab/launch_profile.py" --peers "$repo/.peers" \
      --case "$c" --calls 5 --rows-scale 1 2>&1 | grep -v -i warn
  done | tee "$dest/stamps_small_${setting##*=}.log"
done
cd "$repo" || exit 1
stamp "ncu, b = 1, h = 128, 8K"
OUT="$dest" NCU_CASE=1,128,1,8192 timeout 120 lab/h200_round.sh ncu "${SNAPMLA_COMMIT:-unknown}" 2>&1 | tail -4
stamp "done"
