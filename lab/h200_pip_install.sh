#!/usr/bin/env bash
# `pip install .` on the H200 (device tool), which has no network: the pinned build
# requirements come as wheels carried in .whl/, and the build uses the device's own CMake (no
# build isolation: an isolated build env cannot fetch one). Log in $1/pip_install.log.
# PROFILE=1: the profiling build instead (SNAPMLA_PROFILE_STAMPS=ON, log $1/pip_install_profile.log);
# it stays installed until a later call installs the product again.
set -uo pipefail
cd "$(dirname "$0")/.."
log_dir=${1:-/tmp/h200}
mkdir -p "$log_dir"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps .whl/*.whl
if [ "${PROFILE:-0}" = 1 ]; then
  log="$log_dir/pip_install_profile.log"
  python3 -m pip install -v --no-build-isolation --no-index --no-deps -C cmake.define.SNAPMLA_PROFILE_STAMPS=ON . \
    > "$log" 2>&1 || { tail -30 "$log"; exit 1; }
  grep -m1 "profiling build" "$log" || echo "the build log does not name the profiling build"
else
  log="$log_dir/pip_install.log"
  python3 -m pip install --no-build-isolation --no-index --no-deps . > "$log" 2>&1 || { tail -40 "$log"; exit 1; }
fi
echo "pip install .: $(( $(date +%s) - t0 )) s"
