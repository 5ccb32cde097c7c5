#!/usr/bin/env bash
# The end-to-end benchmark on one H200 (device tool), in one call of about four minutes: build
# the package with `pip install .` (pinned build requirements carried as wheels in .whl/, as
# lab/h200_python.sh), the e2e pytest file (its CUDA-graph test runs there), then
# `python -m snapmla.e2e` at 8K, 16K, 32K and 64K contexts with both caches at the same KV
# budget, writing e2e_h200.{json,md,png} (the PNG where matplotlib is installed) and the logs
# under the output directory: lab/h200_e2e.sh [OUT_DIR] [COMMIT] (default $OUT or /tmp/h200).
# With .peers/ carried (FlashMLA's loader) the BF16 cache runs on FlashMLA's kernel, else on
# decode_bf16 (the output says which). E2E_ARGS adds options (e.g. "--deployments dp,tp8
# --weights-gib 76 --repeats 3"), E2E_CONTEXTS / E2E_WINDOW_S / E2E_NAME change the defaults.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/h200}}
# The commit: pass it (or SNAPMLA_COMMIT) from this machine; the device's copy of the tree may
# carry a stale .git, whose HEAD is not the tree that was sent.
commit=${2:-${SNAPMLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}}
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
# FlashMLA's BF16 kernel is the BF16 cache's baseline wherever .peers/ was carried.
peers=()
[ -f "$repo/.peers/peers.py" ] && peers=(--peers "$repo/.peers")
name=${E2E_NAME:-e2e_h200}
# shellcheck disable=SC2086  (E2E_ARGS is a list of options)
python3 -m snapmla.e2e --contexts ${E2E_CONTEXTS:-8192,16384,32768,65536} --window-s ${E2E_WINDOW_S:-2} "${peers[@]}" \
  ${E2E_ARGS:-} --commit "$commit" --out "$out/$name" 2>&1 | tee "$out/$name.log"
echo "total: $(( $(date +%s) - t0 )) s"
