#!/usr/bin/env bash
# The whole test suite: set up, build (warnings are errors), run every test with CTest, then
# build the Python package with `pip install .` into a virtual environment and run pytest.
# GPU tests (CTest label `gpu`, and the PyTorch GPU tests) skip with a visible message on a
# machine without an sm_90 GPU; the PyTorch tests skip where PyTorch is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -d "$HOME/.local/bin" ] && export PATH="$HOME/.local/bin:$PATH"
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DSNAPMLA_BUILD_TESTS=ON -DSNAPMLA_WERROR=ON
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" --output-junit "$(cd "$BUILD_DIR" && pwd)/ctest.xml" "$@"
python3 scripts/skip_summary.py "$BUILD_DIR/ctest.xml"

# Python package: the same library through scikit-build-core + nanobind (pinned in
# pyproject.toml), tested with NumPy against the float64 formulation in tests/python, and with
# PyTorch (pinned, from PyPI; the CPU reference here) for the custom ops and the e2e engine.
# SNAPMLA_TEST_TORCH=0 leaves PyTorch out: those tests then skip with a message.
VENV="$BUILD_DIR/venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
extras=test
[ "${SNAPMLA_TEST_TORCH:-1}" = 0 ] || extras=test,torch,plot
# The build directory is passed here (pyproject.toml has none, so that `pip install <path>` writes
# nothing into the source tree) so that a second run reuses the build.
"$VENV/bin/python" -m pip install --quiet ".[$extras]" -C build-dir="$BUILD_DIR/python"
"$VENV/bin/python" -c "import snapmla; print(snapmla.info())"
"$VENV/bin/python" -m pytest -q -rs tests/python
