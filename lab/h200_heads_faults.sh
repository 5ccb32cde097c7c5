#!/usr/bin/env bash
# On the H200 (device tool): any head count, bad device inputs, FlashMLA's dense-decoding cases
# on the drop-in, and the eager host cost, with a short summary at the end.
#   lab/h200_heads_faults.sh
# Needs the binaries of lab/h200_round.sh in .devbin/ (snapmla, snapmla_gpu_tests) and the
# Python package installed as lab/h200_python.sh installs it. PEERS=path/to/peers.py adds
# other libraries' calls to the host-cost table (the hook in lab/py_call_overhead.py).
# Logs under $OUT (or /tmp/h200).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200}
bin=.devbin
mkdir -p "$out"
summary=()
note() { summary+=("$1"); }

# 1. GPU tests of the new head counts (both fp8 tiles, decode_bf16), padding rows, bad inputs.
heads='*/h1_*:*/h3_*:*/h8_*:*/h9_*:*/h24_*:*/h63_*:*/h126_*'
"$bin/snapmla_gpu_tests" --gtest_filter="$heads:GpuDecodeHeads*:GpuErrors*:GpuPlan*" > "$out/heads_faults_tests.log" 2>&1
note "gpu tests (heads, padding, bad inputs, plan): exit $? - $(grep -E '^\[  (PASSED|FAILED) ' "$out/heads_faults_tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \] ' "$out/heads_faults_tests.log" | sort -u | head -20 | sed 's/^/    /'

# 2. memcheck over the bad-input and padding tests (the last batch row included in them).
compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/snapmla_gpu_tests" \
  --gtest_filter='GpuErrors*:GpuDecodeHeads*:*/h3_sq4_*:*/h126_sq4_*' > "$out/heads_faults_memcheck.log" 2>&1
note "memcheck (bad inputs, padding rows, h = 3 / 126): exit $? ($(grep -cE '^========= (Invalid|Error)' "$out/heads_faults_memcheck.log") errors)"

# 3. h = 8 against h = 16 at b = 128, 8K (target: within 10%).
"$bin/snapmla" bench --reps 20 --case 128,16,1,8192 --case 128,8,1,8192 --case 128,3,1,8192 \
  --case 128,24,1,8192 --case 128,126,1,8192 > "$out/heads_bench.log" 2>&1
fp8_us() { awk -v h="$1" '$1 == 128 && $2 == h && $3 == 1 {print $6}' "$out/heads_bench.log" | head -1; }
h16=$(fp8_us 16) h8=$(fp8_us 8)
note "decode_fp8 b=128 8K: h=16 ${h16:-?} us, h=8 ${h8:-?} us (ratio $(awk -v a="${h8:-0}" -v b="${h16:-1}" 'BEGIN {printf "%.3f", a / b}'), target <= 1.10); h=3/24/126: $(fp8_us 3) / $(fp8_us 24) / $(fp8_us 126) us"

# 4. FlashMLA's dense-decoding cases (h_kv = 1, both interfaces) and the pointer path on the GPU.
(cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider "$OLDPWD/tests/python/test_flash_mla_cases.py" \
  "$OLDPWD/tests/python/test_fastpath.py") > "$out/flash_mla_cases.log" 2>&1
note "pytest flash_mla cases + pointer path: exit $? - $(tail -1 "$out/flash_mla_cases.log")"

# 5. Eager host cost (b = 4, 256 tokens: the GPU waits on the host).
(cd /tmp && python3 "$OLDPWD/lab/py_call_overhead.py" ${PEERS:+--peers "$PEERS"}) > "$out/call_overhead.log" 2>&1
note "host cost per call (us; host / wall / GPU):"
while IFS= read -r line; do note "    $line"; done < <(tail -n +3 "$out/call_overhead.log")

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
