#!/usr/bin/env bash
# One training seed of the quality study on the H200 (device tool), in one call of about 9-10
# minutes: `pip install .` (lab/h200_pip_install.sh, ~20 s), the study's CPU test (~15 s), then
# tools/quality/quality.py: train the small MLA model with retrieval sequences mixed in
# (--train-seconds, default 300), then evaluate the trained model and its outlier transform
# through the BF16, SnapMLA FP8 and per-tensor FP8 caches: perplexity over the whole held-out
# set (~10 s each), retrieval at 8K / 32K / 64K (~40 s each), greedy generation (~15 s).
# --budget-seconds (default here 530) keeps the study inside the call: past it, retrieval stops
# adding samples and greedy generation is left out (the JSON says what ran).
#
#   SNAPMLA_COMMIT=<hash> OUT=... lab/h200_quality.sh --seed N [quality.py options]
#
# writes quality.json, quality.md and the logs under $OUT (or /tmp/h200/quality); extra
# arguments go to quality.py (e.g. --retrieval-diagnostics: retrieval also through the emulated
# FP8 parts, which says whether FP8 QK or FP8 PV changes an answer). SEEDS="0 1 2" instead trains and evaluates those seeds at the same
# time, one process each on the one GPU (a small model leaves most of it idle, so each runs
# nearly as fast as alone; the steps each reached are in its JSON), into $OUT/seed<N>/, and
# merges them into $OUT/quality.{json,md}; the seeds' folders are then packed into
# $OUT/seeds.tar.xz (the device tool returns at most 8 files). Seeds run as separate calls are combined here with
#   python tools/quality/quality.py --merge docs/results S0/quality.json S1/quality.json S2/quality.json
# and the README's quality table with --readme-table docs/results/quality.json.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200/quality}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
[ -n "${SKIP_INSTALL:-}" ] || lab/h200_pip_install.sh "$out" || exit 1  # SKIP_INSTALL=1: installed by the caller
repo=$PWD
cd /tmp  # import the installed package, not the source tree
python3 -c "import snapmla; print(snapmla.info())"
python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/python/test_quality.py" 2>&1 | tee "$out/pytest_quality.log" | tail -3
study="$repo/tools/quality/quality.py"
if [ -z "${SEEDS:-}" ]; then
  python3 "$study" --out "$out" --budget-seconds 530 "$@" 2>&1 | tee "$out/quality.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] && python3 "$study" --summary "$out/quality.json"
  exit "$rc"
fi
pids=()
for seed in $SEEDS; do
  mkdir -p "$out/seed$seed"
  python3 "$study" --out "$out/seed$seed" --seed "$seed" --budget-seconds 530 "$@" > "$out/seed$seed/quality.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
for seed in $SEEDS; do
  echo "== seed $seed"; grep -v "ppl windows\|train step" "$out/seed$seed/quality.log" | tail -4
done
[ "$rc" -eq 0 ] || exit "$rc"
jsons=()
for seed in $SEEDS; do jsons+=("$out/seed$seed/quality.json"); done
if [ ${#jsons[@]} -gt 1 ]; then python3 "$study" --merge "$out" "${jsons[@]}" || exit 1; else python3 "$study" --summary "${jsons[0]}"; fi
tar -cJf "$out/seeds.tar.xz" -C "$out" $(for seed in $SEEDS; do echo "seed$seed"; done) \
  && for seed in $SEEDS; do rm -rf "${out:?}/seed$seed"; done
