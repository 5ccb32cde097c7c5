# Sourced first by a device round that writes into one output folder
# (`. "$(dirname "$0")/round_start.sh" "$@"`): the repository root as the working directory and
# `repo`, `dest` (the round's first argument, else $OUT, else /tmp/h200; created, absolute), the
# build's parallelism, unbuffered Python, and `stamp MESSAGE` (seconds since the round began).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
repo=$PWD
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
