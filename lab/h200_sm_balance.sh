#!/usr/bin/env bash
# One device call: whether decode_fp8's CTAs end together where the work is balanced, and if not,
# whether their SMs say why. Installs the profiling build (SNAPMLA_PROFILE_STAMPS=ON), then for each
# case runs lab/launch_profile.py twice (two processes, reporting the 3rd and the 5th launch) with
# SNAPMLA_PROFILE_DUMP, so that every CTA's record (its SM, pages, milestones) lands in
# OUT/sm_balance.csv with the case and the run; lab/sm_balance.py summarizes it.
#   [CASES="b,h,s_q,s_k ..."] lab/h200_sm_balance.sh OUT   (carry .devbin, .whl, .peers; about two minutes)
. "$(dirname "$0")/round_start.sh" "$@"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
stamp "pip install . (profiling build)"
PROFILE=1 lab/h200_pip_install.sh "$dest" || exit 1
cd /tmp || exit 1  # the installed package
out="$dest/sm_balance.csv"
rm -f "$out"
for c in ${CASES:-128,16,1,32768 128,128,1,8192 128,64,1,8192 16,16,1,32768 46,16,1,32768}; do
  for call in 3 5; do
    rm -f /tmp/dump.csv
    SNAPMLA_PROFILE_DUMP=/tmp/dump.csv SNAPMLA_PROFILE_CALL=$call timeout 60 python3 "$repo/lab/launch_profile.py" \
      --peers "$repo/.peers" --case "$c" --calls $((call + 1)) 2>&1 | grep -v -i warn | grep -E "profile:|span" | head -3
    [ -f /tmp/dump.csv ] || { echo "no dump for $c"; continue; }
    awk -v c="b${c//,/_}" -v r="run$call" 'NR == 1 { if (!hdr) print "case,run," $0; next } { print c "," r "," $0 }' \
      hdr=$([ -f "$out" ] && echo 1 || echo 0) /tmp/dump.csv >> "$out"
  done
done
stamp "summary"
python3 "$repo/lab/sm_balance.py" "$out" | tee "$dest/sm_balance.txt"
stamp "done"
