#!/usr/bin/env bash
# bench_sampling.sh - dsq_step / GPU sampling on the H200 in one go: build,
# the sampling kernel tests (with their timing table), the CUDA end-to-end
# test, then `dsqwen bench` on a random-weight model of the exact 1.5B shape
# (made with transformers as tests/fixtures/fullsize_check.py does, seeded)
# with the three --sampling modes at batch 1, 64 (FP16 KV) and 256 (INT8 KV),
# 1,024-token prompts.  Run from the repository root with .deps/ present;
# logs in $OUT (default /tmp/bench_sampling).
set -u
OUT=${OUT:-/tmp/bench_sampling}
B=${BUILD_DIR:-/tmp/bs}
mkdir -p "$OUT"
ROOT=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DDSQ_CUDA=ON >"$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 --target dsqwen dsqwen-cli >>"$OUT/build.log" 2>&1
rc=$?
echo "== build rc=$rc ($(( $(date +%s) - t0 )) s)"
if [ $rc != 0 ]; then grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; fi
for t in test_cuda_sampling test_cuda_e2e test_step; do
    cmake --build $B -j16 --target $t >>"$OUT/build.log" 2>&1 || { echo "== build of $t failed"; grep -E "error" -A3 "$OUT/build.log" | head -20; }
done
export DSQ_TEST_DATA=$ROOT/tests/data
ls $DSQ_TEST_DATA/tiny/config.json >/dev/null || { echo "no test data at $DSQ_TEST_DATA"; exit 1; }
timeout 200 $B/tests/test_cuda_sampling >"$OUT/sampling.log" 2>&1; echo "== test_cuda_sampling rc=$?"
grep -E "OK|FAILED|PASSED|timing|GPU|greedy|flat|error|Error|fail" "$OUT/sampling.log" | head -40
timeout 120 $B/tests/test_cuda_e2e >"$OUT/e2e.log" 2>&1; echo "== test_cuda_e2e rc=$?"
grep -E "FAILED|PASSED" "$OUT/e2e.log" | head
timeout 60 $B/tests/test_step >"$OUT/step.log" 2>&1; echo "== test_step rc=$?"
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
M=/tmp/dsq_fullsize
timeout 150 python3 - <<PY >"$OUT/model.log" 2>&1
import sys, shutil
sys.path.insert(0, "$ROOT/tests/fixtures")
from fullsize_check import build_model
build_model("$ROOT/tests/data/model/config.json", "$M", 20240601)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy("$ROOT/tests/data/model/" + f, "$M/" + f)
print("model ready")
PY
echo "== model rc=$? ($(tail -1 $OUT/model.log))"
CLI=$B/examples/dsqwen
run() { # name args...
    local name=$1; shift
    timeout 120 $CLI bench --model $M --prompt-len 1024 --max-tokens 64 "$@" >"$OUT/$name.log" 2>&1
    echo "== $name rc=$? : $*"; tail -n +1 "$OUT/$name.log" | grep -vE "^\s*$" | tail -3
}
run b1_f16_gpu --batch 1 --kv f16
run b64_f16_gpu --batch 64 --kv f16
run b64_f16_greedy --batch 64 --kv f16 --temperature 0
run b64_f16_none --batch 64 --kv f16 --sampling none
run b64_f16_host --batch 64 --kv f16 --sampling host
run b256_int8_gpu --batch 256 --kv int8
run b256_int8_none --batch 256 --kv int8 --sampling none
run b256_f16_gpu --batch 256 --kv f16
run b1_f16_none --batch 1 --kv f16 --sampling none
echo "total $(( $(date +%s) - t0 )) s"
