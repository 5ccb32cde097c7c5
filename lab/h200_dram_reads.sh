#!/usr/bin/env bash
# One short device call: the bytes one decode_fp8 launch reads from DRAM against the cache's own
# bytes (b x s_k x 644: each token's latent, scale and rope once), by Nsight Compute on the product
# CLI's bench. At h = 128 a worker's two 64-row tiles are two CTAs that read the same pages; L2
# serves the second read only while the two stay within a few pages of each other (50 MB of L2
# over 132 streaming CTAs is ~9 pages of 41 KB each). A ratio near 1 says they do; near 2, that
# they drift apart and the call reads its cache twice (h = 64, one row tile, is the control).
# Also the L2 hit rate and the launch's duration.
#   lab/h200_dram_reads.sh [OUT_DIR]   (carry .devbin; CASES="b,h,s_q,s_k ...", under a minute)
# shellcheck source=lab/round_start.sh
. "$(dirname "$0")/round_start.sh" "$@"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee "$dest/gpu.txt"
printf "%-16s %12s %12s %7s %9s %10s\n" case "dram MB" "cache MB" ratio "L2 hit %" "us" | tee "$dest/dram_reads.txt"
for c in ${CASES:-128,128,1,8192 64,128,1,32768 128,128,1,32768 256,128,1,32768 128,64,1,8192 128,64,1,32768}; do
  log="$dest/ncu_${c//,/_}.txt"
  timeout 120 ncu --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
    --kernel-name regex:'decode_fp8.*kernel' --launch-skip 3 --launch-count 1 \
    .devbin/snapmla bench --reps 3 --case "$c" > "$log" 2>&1
  IFS=, read -r b h s_q s_k <<< "$c"
  # ncu prints "metric  unit  value"; the units scale to MB and us.
  awk -v c="$c" -v cache="$(( b * s_k * 644 ))" '
    function scale(u) { return u == "byte" ? 1e-6 : u == "Kbyte" ? 1e-3 : u == "Mbyte" ? 1 : u == "Gbyte" ? 1e3 : u == "Tbyte" ? 1e6 : 0 }
    function usec(u) { return u == "nsecond" || u == "ns" ? 1e-3 : u == "usecond" || u == "us" ? 1 : u == "msecond" || u == "ms" ? 1e3 : u == "second" || u == "s" ? 1e6 : 0 }
    $1 == "dram__bytes_read.sum" { dram = $3 * scale($2) }
    $1 == "lts__t_sector_hit_rate.pct" { hit = $3 }
    $1 == "gpu__time_duration.sum" { us = $3 * usec($2) }
    END { mb = cache / 1e6; printf "%-16s %12.1f %12.1f %7.3f %9.1f %10.1f\n", c, dram, mb, (mb > 0 ? dram / mb : 0), hit, us }
  ' "$log" | tee -a "$dest/dram_reads.txt"
done
stamp "done"
