#!/usr/bin/env bash
# The Python package on the H200 (device tool): build it there with `pip install .`
# (lab/h200_pip_install.sh), then the whole pytest suite (PyTorch GPU tests included: FlashMLA's
# dense-decoding cases among them), the example and the call-overhead probe.
# Logs under $OUT (or /tmp/h200).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)"
lab/h200_pip_install.sh "$out" || exit 1
cd /tmp  # import the installed package, not the source tree
python3 -c "import snapmla; print(snapmla.info())"
python3 -m pytest -q -rs -p no:cacheprovider "$OLDPWD/tests/python" 2>&1 | tee "$out/pytest.log" | tail -25
python3 "$OLDPWD/examples/decode_step.py" 2>&1 | tee "$out/decode_step.log"
python3 "$OLDPWD/examples/decode_step.py" --batch 128 --heads 128 --context 8192 2>&1 | tee "$out/decode_step_b128.log" | tail -4
# PEERS=path/to/peers.py adds other libraries' calls (the hook in lab/py_call_overhead.py).
python3 "$OLDPWD/lab/py_call_overhead.py" ${PEERS:+--peers "$PEERS"} 2>&1 | tee "$out/call_overhead.log"
