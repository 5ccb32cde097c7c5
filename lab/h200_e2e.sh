#!/usr/bin/env bash
# The end-to-end benchmark on one H200 (device tool), in one call of about four minutes: build
# the package with `pip install .` (pinned build requirements carried as wheels in .whl/, as
# lab/h200_python.sh), the e2e pytest file (its CUDA-graph test runs there), then
# `python -m snapmla.e2e` at 8K, 16K, 32K and 64K contexts with both caches at the same KV
# budget, writing e2e_h200.{json,md,png} (the PNG where matplotlib is installed) and the logs
# under the output directory: lab/h200_e2e.sh [OUT_DIR] [COMMIT] (default $OUT or /tmp/h200).
# E2E_ARGS adds options: E2E_ARGS="--bf16-kernel flashmla --peers $PWD/.peers" (an absolute path:
# the run starts in /tmp) measures the BF16 cache on FlashMLA's kernel (files
# e2e_h200_flashmla.*), E2E_ARGS=--moe-standin with the MoE stand-in.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/h200}}
commit=${2:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
t0=$(date +%s)
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
python3 -m pip install --no-build-isolation --no-index --no-deps . > "$out/pip_install.log" 2>&1 ||
  { tail -40 "$out/pip_install.log"; exit 1; }
echo "pip install .: $(( $(date +%s) - t0 )) s"
repo=$PWD
cd /tmp  # import the installed package, not the source tree
python3 -c "import snapmla; print(snapmla.info())"
python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/python/test_e2e.py" 2>&1 | tee "$out/pytest_e2e.log" | tail -4
name=e2e_h200
case "${E2E_ARGS:-}" in *flashmla*) name=${name}_flashmla ;; esac
case "${E2E_ARGS:-}" in *moe-standin*) name=${name}_moe ;; esac
# shellcheck disable=SC2086  (E2E_ARGS is a list of options)
python3 -m snapmla.e2e --contexts 8192,16384,32768,65536 --output-len 1024 --window-s 2 ${E2E_ARGS:-} \
  --commit "$commit" --out "$out/$name" 2>&1 | tee "$out/$name.log"
echo "total: $(( $(date +%s) - t0 )) s"
