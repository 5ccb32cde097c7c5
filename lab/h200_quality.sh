#!/usr/bin/env bash
# The quality study on the H200 (device tool), in one call of about 5 minutes: `pip install .`
# (lab/h200_pip_install.sh), the study's CPU test, then tools/quality/quality.py: train the
# small MLA model (--train-seconds, default 210) and evaluate it through the BF16, SnapMLA FP8
# and per-tensor FP8 caches. Writes quality.json, quality.md and the logs under $OUT (or
# /tmp/h200/quality); extra arguments go to quality.py.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200/quality}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
lab/h200_pip_install.sh "$out" || exit 1
repo=$PWD
cd /tmp  # import the installed package, not the source tree
python3 -c "import snapmla; print(snapmla.info())"
python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/python/test_quality.py" 2>&1 | tee "$out/pytest_quality.log" | tail -3
python3 "$repo/tools/quality/quality.py" --out "$out" "$@" 2>&1 | tee "$out/quality.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && python3 "$repo/tools/quality/quality.py" --summary "$out/quality.json"
exit "$rc"
