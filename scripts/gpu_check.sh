#!/usr/bin/env bash
# gpu_check.sh - build, test and time the CUDA backend on the GPU test machine
# in one go (the machine is started per call, so everything belongs together).
#
#   bash scripts/gpu_check.sh            # from the repository root, .deps/ present
#
# Logs go to $OUT (or /tmp/gpu_check): build.log kernels.log e2e.log (also
# run with CUDA graphs off) threads.log fullsize.log shape7b.log memcheck.log
# ctest.log fullsize_results.json shape_results.json summary.txt.
# A summary table is printed last.  Each step has a time limit so the whole
# run fits one 10-minute call; SKIP_* variables leave steps out
# (SKIP_FULLSIZE=1, SKIP_SHAPE7B=1, SKIP_MEMCHECK=1, SKIP_CTEST=1).
set -u
OUT=${OUT:-/tmp/gpu_check}
B=${BUILD_DIR:-/tmp/b}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
t_start=$(date +%s)
declare -a NAMES RCS TIMES

step() { # step NAME LIMIT_S LOG cmd...
    local name=$1 limit=$2 log=$3
    shift 3
    local t0=$(date +%s)
    timeout "$limit" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    NAMES+=("$name"); RCS+=("$rc"); TIMES+=($(( $(date +%s) - t0 )))
    echo "== $name: rc=$rc ($(( $(date +%s) - t0 )) s)"
    return $rc
}

source scripts/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
nvcc --version | tail -1

# SKIP_BUILD=1: $B already holds the binaries (scripts/pack_prebuilt.sh);
# there is then no CMake tree for ctest, so every other tests/test_cuda_*
# binary is run directly instead
if [ "${SKIP_BUILD:-0}" = 1 ]; then
    step build 10 build.log test -x "$B/tests/test_cuda_kernels"
else
    step build 300 build.log bash -c "cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DDSQ_CUDA=ON && cmake --build $B -j16"
fi
if [ "${RCS[0]}" != 0 ]; then
    grep -E "error|Error" -A4 "$OUT/build.log" | head -60
    exit 1
fi
export DSQ_TEST_DATA=$PWD/tests/data
step kernels 120 kernels.log "$B/tests/test_cuda_kernels"
step e2e 180 e2e.log bash -c "$B/tests/test_cuda_e2e; r=\$?; echo '### again with DSQ_CUDA_GRAPHS=0'; DSQ_CUDA_GRAPHS=0 $B/tests/test_cuda_e2e; exit \$(( r | \$? ))"
if [ "${SKIP_FULLSIZE:-0}" != 1 ]; then
    export PYTHONUNBUFFERED=1
    step fullsize 300 fullsize.log python3 tests/fixtures/fullsize_check.py \
        --lib "$B/libdsqwen.so" --config tests/data/model/config.json --out "$OUT"
fi
step threads 120 threads.log "$B/tests/test_cuda_threads"
if [ "${SKIP_SHAPE7B:-0}" != 1 ]; then
    # random weights of the DeepSeek-R1-Distill-Qwen-7B shape vs transformers
    step shape7b 420 shape7b.log python3 tests/fixtures/shape_check.py \
        --lib "$B/libdsqwen.so" --config tests/data/configs/r1-distill-qwen-7b.json --out "$OUT"
fi
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
    step memcheck 150 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_cuda_e2e"
    step racecheck 150 racecheck.log env DSQ_ATTN_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_cuda_attention"
fi
if [ "${SKIP_CTEST:-0}" != 1 ] && [ "${SKIP_BUILD:-0}" = 1 ]; then
    step ctest 400 ctest.log bash scripts/run_cuda_tests.sh "$B" '^test_cuda_(kernels|e2e|threads)$'
elif [ "${SKIP_CTEST:-0}" != 1 ]; then
    step ctest 200 ctest.log bash -c "cd $B && ctest --output-on-failure -j8 --timeout 120 -E 'test_cuda_(kernels|e2e|threads)'"
fi

{
    echo "=== gpu_check summary ($(date -u +%F\ %T) UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
    printf "%-10s %4s %6s\n" step rc secs
    for i in "${!NAMES[@]}"; do printf "%-10s %4s %6s\n" "${NAMES[$i]}" "${RCS[$i]}" "${TIMES[$i]}"; done
    echo "--- kernels"; grep -E "FAILED|PASSED|product timing|gemv|cuBLASLt|^\s+(qkv|o |gate|down|lm_head)" "$OUT/kernels.log" | grep -vE "^\s+gem[mv] T=" | tail -45
    grep -E "worst \|d\|/tol" "$OUT/kernels.log" | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/  worst |d|\/tol over all kernel cases: /'
    echo "--- e2e"; grep -E "###|max\|a-b\||argmax|FAILED|PASSED|KV_FULL|SKIP|Error|error|step .* seq" "$OUT/e2e.log" | head -70
    [ -f "$OUT/memcheck.log" ] && { echo "--- memcheck"; grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/memcheck.log" | head -8; }
    [ -f "$OUT/racecheck.log" ] && { echo "--- racecheck"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|hazard|PASSED|FAILED" "$OUT/racecheck.log" | head -8; }
    [ -f "$OUT/ctest.log" ] && { echo "--- ctest"; grep -E "tests passed|Failed|\*\*\*|Not Run|Skipped|SKIPPED" "$OUT/ctest.log" | head -20; }
    [ -f "$OUT/fullsize.log" ] && { echo "--- fullsize"; grep -E "^(static|paged)/|^decode batch|without|GPU time per step|^ +[0-9.]+ us|Error|error|Traceback" "$OUT/fullsize.log" | head -50; }
    echo "total $(( $(date +%s) - t_start )) s"
} | tee "$OUT/summary.txt"
