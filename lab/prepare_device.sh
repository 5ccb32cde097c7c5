#!/usr/bin/env bash
# Prepares this checkout for a round on the H200 (the device has no network and builds nothing of
# the C++ suite itself): the C++ binaries the h200_*.sh scripts run, built here as CI builds them,
# into .devbin/; the Python build requirements pinned in pyproject.toml as wheels in .whl/ (the
# device's `pip install .` takes them from there); and, given a folder with the peer libraries
# (`peers.py` and their built extensions, as `python -m snapmla.bench --peers` takes), a copy of it
# in .peers/. All three are git-ignored, so they travel with the call's `carry`.
#   lab/prepare_device.sh [PEERS_DIR]
# The command-line tool (build/snapmla, which h200_round.sh and h200_dram_reads.sh run) joins them
# only with DEVBIN_CLI=1: each binary holds every kernel (~18 MB), and a call carries 64 MiB at most.
# Then, e.g.: device call with carry [".devbin", ".whl", ".peers"] and
#   SNAPMLA_COMMIT=$(git rev-parse --short HEAD) SAN=1 lab/h200_suite.sh $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSNAPMLA_BUILD_TESTS=ON -DSNAPMLA_WERROR=ON > /dev/null
cmake --build "$build" -j "$(nproc)"
mkdir -p .devbin
cp "$build/tests/snapmla_tests" "$build/tests/snapmla_gpu_tests" .devbin/
if [ -n "${DEVBIN_CLI:-}" ]; then cp "$build/snapmla" .devbin/; else rm -f .devbin/snapmla; fi
# The pinned build requirements (and what scikit-build-core needs beside them), as wheels.
requirements=$(python3 -c "import re; t=open('pyproject.toml').read(); print(' '.join(re.findall(r'\"([\w.-]+==[\w.]+)\"', t.split('[project]')[0])))")
mkdir -p .whl
python3 -m pip download --quiet --no-deps -d .whl $requirements pathspec
if [ $# -ge 1 ]; then
  mkdir -p .peers
  cp "$1"/*.so "$1"/peers.py .peers/
fi
echo ".devbin: $(ls .devbin | tr '\n' ' ')"
echo ".whl: $(ls .whl | tr '\n' ' ')"
[ -d .peers ] && echo ".peers: $(ls .peers | tr '\n' ' ')"
echo "carried: $(du -shc .devbin .whl .peers 2>/dev/null | tail -1 | cut -f1) (at most 64 MiB with the tracked files)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
