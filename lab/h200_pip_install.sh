#!/usr/bin/env bash
# `pip install .` on the H200 (device tool), which has no network: the pinned build
# requirements come as wheels carried in .whl/, and the build uses the device's own CMake (no
# build isolation: an isolated build env cannot fetch one). Log in $1/pip_install.log.
set -uo pipefail
cd "$(dirname "$0")/.."
log_dir=${1:-/tmp/h200}
mkdir -p "$log_dir"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps .whl/*.whl
python3 -m pip install --no-build-isolation --no-index --no-deps . > "$log_dir/pip_install.log" 2>&1 ||
  { tail -40 "$log_dir/pip_install.log"; exit 1; }
echo "pip install .: $(( $(date +%s) - t0 )) s"
