#!/usr/bin/env bash
# The whole test suite on the H200 in one device call, one process per framework, as
# scripts/test.sh runs it on a machine with an sm_90 GPU, but offline (the H200 machine has no
# network): the C++ CPU and GPU suites from binaries built here with nvcc (.devbin/: build/tests/
# snapmla_tests and snapmla_gpu_tests, build/snapmla), unfiltered; `pip install .` from the wheels
# in .whl/; then the whole pytest suite in one interpreter (the PyTorch GPU tests run there).
#   lab/h200_suite.sh [OUT_DIR]     (default $OUT or /tmp/h200); its logs come back as OUT_DIR/h200_suite.tgz
# HOST_COST=1 adds the eager host cost per call against FlashMLA's extensions (lab/py_call_overhead.py, .peers/).
# SAN=1 adds compute-sanitizer (lab/h200_sanitize.sh). GPU_ENVS="NAME=VALUE ..." reruns the GPU suite under each setting. SWEEP=1 / GRID=1 add the bench's sweep / grid with the peers (.peers/) into OUT_DIR/results
# (h200_sweep.*, h200.*), BENCH_ARGS passed to both (e.g. lab variants: --env LABEL:NAME=VALUE).
# Every part's timeout is cut to what is left of LIMIT seconds (default 570), so that the archive
# is written inside the device's 600-second limit. Exit status: the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-${OUT:-/tmp/h200}}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
out=$(mktemp -d /tmp/h200suite.XXXX)
trap 'tar czf "$dest/h200_suite.tgz" -C "$out" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# A part's timeout: its own (N seconds), cut to what is left before LIMIT.
cap() { local left=$(( ${LIMIT:-570} - ($(date +%s) - t0) )); [ "$left" -lt 1 ] && left=1; [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
failed=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
for suite in snapmla_tests snapmla_gpu_tests; do
  stamp "$suite (whole)"
  timeout $(cap ${TEST_TIMEOUT:-300}) ".devbin/$suite" > "$out/$suite.log" 2>&1
  rc=$?
  echo "$suite exit: $rc"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] [0-9]+ tests" "$out/$suite.log" | tail -6
  grep -E "^\[  FAILED  \]" "$out/$suite.log" | head -20
  [ $rc -eq 0 ] || failed=$((failed + 1))
done
# GPU_ENVS="NAME=VALUE ...": the GPU suite again under each lab setting (e.g. the planner's
# SNAPMLA_PLAN_FILL=1, decode_fp8's SNAPMLA_FP8_P_SCALE=carried_wide): every decode and plan check
# then runs with it on both paths.
for setting in ${GPU_ENVS:-}; do
  stamp "snapmla_gpu_tests under $setting"
  log="$out/snapmla_gpu_tests_${setting//[^A-Za-z0-9_]/_}.log"
  env "$setting" timeout $(cap ${TEST_TIMEOUT:-300}) .devbin/snapmla_gpu_tests > "$log" 2>&1
  rc=$?
  echo "snapmla_gpu_tests ($setting) exit: $rc"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$log" | head -20
  [ $rc -eq 0 ] || failed=$((failed + 1))
done
# SAN=1: compute-sanitizer (lab/h200_sanitize.sh) before the Python part.
if [ -n "${SAN:-}" ]; then
  stamp "memcheck / racecheck / synccheck"
  # Five tool runs, each bounded by SAN_TIMEOUT: a fifth of what is left, at most 100 s each (and
  # a short sixth, the lab lookups, at most 60 s).
  SAN_TIMEOUT=$(( $(cap ${SAN_TIMEOUT:-500}) / 5 + 1 )) lab/h200_sanitize.sh "$out"
fi
stamp "pip install ."
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/*.whl
if python3 -m pip install --no-build-isolation --no-index --no-deps . > "$out/pip_install.log" 2>&1; then
  repo=$PWD
  cd /tmp  # the installed package, not the source tree
  python3 -c "import snapmla; print(snapmla.info())" | tee "$out/info.txt"
  stamp "pytest (whole suite, one process)"
  timeout $(cap ${PYTEST_TIMEOUT:-400}) python3 -X faulthandler -m pytest -q -rs --durations=15 -p no:cacheprovider "$repo/tests/python" \
    > "$out/pytest.log" 2>&1
  rc=$?
  echo "pytest exit: $rc"
  tail -1 "$out/pytest.log"
  grep -E "^(FAILED|ERROR) |Fatal Python error" "$out/pytest.log" | head -20
  # A skip on this machine is a GPU test that did not run: list them.
  grep -E "^SKIPPED" "$out/pytest.log" | head -10
  [ $rc -eq 0 ] || failed=$((failed + 1))
  # HOST_COST=1: the eager host cost per call beside FlashMLA's extensions, same process.
  if [ -n "${HOST_COST:-}" ] && [ -f "$repo/.peers/peers.py" ]; then
    stamp "host cost per call, with the peers"
    timeout $(cap 90) python3 "$repo/lab/py_call_overhead.py" --peers "$repo/.peers/peers.py" 2>&1 | tee "$out/call_overhead.log" | tail -14
  fi
  # SWEEP=1 / GRID=1: the bench with the peers into $dest/results.
  bench() {  # LOG_NAME BENCH_OPTIONS...
    local name=$1; shift
    stamp "bench $name, with the peers"
    # shellcheck disable=SC2086
    timeout $(cap ${BENCH_TIMEOUT:-240}) python3 -m snapmla.bench --peers "$repo/.peers" "$@" ${BENCH_ARGS:-} \
      --out "$dest/results" > "$out/bench_$name.log" 2>&1
    echo "bench $name exit: $?"
    grep -E "^- " "$out/bench_$name.log" | head -20
  }
  [ -n "${SWEEP:-}" ] && bench sweep --sweep
  [ -n "${GRID:-}" ] && bench grid --cases grid
else
  tail -30 "$out/pip_install.log"
  failed=$((failed + 1))
fi
stamp "done: $failed part(s) failed"
exit $failed
