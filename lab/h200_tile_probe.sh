#!/usr/bin/env bash
# One device call: why a lab tile is slower than the default. Nsight Compute's full set on one
# decode_fp8 launch under the default tile and under each of PROBE_TILES (SNAPMLA_FP8_TILE values,
# default `trio`) at NCU_CASE (default b = 128, h = 128, 8K; lab/h200_round.sh ncu), then the lab
# options' bench (lab/h200_lab_options.sh PARTS=bench) with VARIANTS (default "trio triof bnarrow
# dpdl"), the sweep and the grid, without the kernel timeline; SUITE_ENV adds the C++ GPU suite
# under lab settings. Everything comes back as one archive,
# OUT_DIR/tile_probe.tgz, plus the bench's JSON.
#   [PROBE_TILES="trio"] [NCU_CASE=b,h,s_q,s_k] [SUITE_ENV="NAME=VALUE ..."] [VARIANTS=...]
#   lab/h200_tile_probe.sh OUT_DIR
#   (carry .devbin, .whl, .peers; about five minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d /tmp/tileprobe.XXXX)
trap 'tar czf "$dest/tile_probe.tgz" -C "$work" . 2>/dev/null; cp "$work"/bench/results/*.json "$dest"/ 2>/dev/null' EXIT
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
commit=${SNAPMLA_COMMIT:-unknown}
mkdir -p "$work/ncu" "$work/bench"
export NCU_CASE=${NCU_CASE:-128,128,1,8192}
for tile in default ${PROBE_TILES:-trio}; do
  stamp "ncu, decode_fp8 at $NCU_CASE, tile $tile"
  if [ "$tile" = default ]; then
    OUT="$work/ncu" timeout "${NCU_TIMEOUT:-120}" lab/h200_round.sh ncu "$commit" 2>&1 | tail -4
  else
    SNAPMLA_FP8_TILE=$tile OUT="$work/ncu" timeout "${NCU_TIMEOUT:-120}" lab/h200_round.sh ncu "$commit" 2>&1 | tail -4
  fi
  gzip -f "$work"/ncu/ncu_source_*.csv 2>/dev/null
done
# SUITE_ENV="NAME=VALUE ...": the whole C++ GPU suite under each setting (a lab option on its way
# to a default: bad inputs, graph replay, batch 1024, 256K tokens, the plans).
for setting in ${SUITE_ENV:-}; do
  stamp "the C++ GPU suite under $setting"
  env "$setting" timeout "${SUITE_TIMEOUT:-150}" .devbin/snapmla_gpu_tests > "$work/gpu_suite_${setting%%=*}.log" 2>&1
  echo "exit: $? (124: timed out)"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$work/gpu_suite_${setting%%=*}.log" | tail -8
done
stamp "the lab options' bench"
PARTS=bench VARIANTS="${VARIANTS:-trio triof bnarrow dpdl}" BENCH_ARGS="${BENCH_ARGS:---rounds 3}" BUDGET=0 \
  LIMIT=$(( ${LIMIT:-540} - ($(date +%s) - t0) )) lab/h200_lab_options.sh "$work/bench" 2>&1 | grep -vE "^  |^b="
stamp "done"
