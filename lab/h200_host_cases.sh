#!/usr/bin/env bash
# On the H200 (device tool), one call: the package built there, then the whole pytest suite (the
# PyTorch GPU tests, FlashMLA's dense-decoding cases on the drop-in, the side-stream and pointer
# path tests), the eager host cost against FlashMLA's extensions in the same process, and the
# Python side of it alone. Needs .whl/ (lab/h200_pip_install.sh) and .peers/ (a peers.py with the
# FlashMLA BF16 and FP8-fork loaders). Logs under $OUT (or /tmp/h200).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
lab/h200_pip_install.sh "$out" || exit 1
src=$PWD
cd /tmp  # import the installed package, not the source tree
python3 -c "import snapmla; print(snapmla.info())"
echo "== pytest"
timeout 420 python3 -m pytest -q -rs -p no:cacheprovider "$src/tests/python" 2>&1 | tee "$out/pytest.log" | tail -15
echo "pytest exit: ${PIPESTATUS[0]}"
echo "== host cost per call, with the peers"
timeout 90 python3 "$src/lab/py_call_overhead.py" --peers "$src/.peers/peers.py" 2>&1 | tee "$out/call_overhead.log"
timeout 60 python3 "$src/lab/py_call_overhead.py" --peers "$src/.peers/peers.py" --inference-mode 2>&1 |
  tee "$out/call_overhead_inference.log" | tail -12
echo "== the Python side alone (decode entry points stubbed)"
timeout 60 python3 "$src/lab/host_cost.py" --device cuda 2>&1 | tee "$out/host_cost.log" | tail -12
