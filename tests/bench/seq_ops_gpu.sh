#!/usr/bin/env bash
# seq_ops_gpu.sh - on the H200 test machine, in one call: build the CUDA
# library, run the sequence-operation and mixed-pass GPU tests, the CUDA
# end-to-end test, and the mixed-step benchmark on a full-size random-weight
# model (made with HF transformers as tests/fixtures/fullsize_check.py does,
# seeded).  Logs under $OUT; a summary last.  Run from the repository root
# after `source scripts/device_env.sh` (with .deps carried).
set -u
OUT=${OUT:-/tmp/seqops_gpu}
B=${BUILD_DIR:-/tmp/bseq}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 300 bash -c "cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release -DDSQ_CUDA=ON -DDSQ_BUILD_EXAMPLES=OFF >$OUT/build.log 2>&1 && cmake --build $B -j16 --target test_cuda_seq_ops test_cuda_e2e bench_mixed_step >>$OUT/build.log 2>&1"
echo "build rc=$? ($(el))"
grep -E "error" -A3 "$OUT/build.log" | head -30
export DSQ_TEST_DATA=$PWD/tests/data
timeout 90 "$B/tests/test_cuda_seq_ops" >"$OUT/seq_ops.log" 2>&1; echo "test_cuda_seq_ops rc=$? ($(el))"
( timeout 120 python3 -c "import sys; sys.path.insert(0, 'tests/fixtures'); import fullsize_check as f; f.build_model('tests/data/model/config.json', '/tmp/dsq_fullsize', 20240601)" >"$OUT/model.log" 2>&1; echo "model rc=$? ($(el))" )
timeout 75 "$B/tests/bench_mixed_step" /tmp/dsq_fullsize 1024 63 2048 512 5 >"$OUT/bench.log" 2>&1; echo "bench rc=$? ($(el))"
DSQ_CUDA_MIXED=0 timeout 60 "$B/tests/bench_mixed_step" /tmp/dsq_fullsize 1024 63 2048 512 3 >"$OUT/bench_nosplit.log" 2>&1; echo "bench nosplit rc=$? ($(el))"
timeout 90 "$B/tests/test_cuda_e2e" >"$OUT/e2e.log" 2>&1; echo "test_cuda_e2e rc=$? ($(el))"
DSQ_CUDA_GRAPHS=0 timeout 60 "$B/tests/test_cuda_seq_ops" >"$OUT/seq_ops_nographs.log" 2>&1; echo "test_cuda_seq_ops without graphs rc=$? ($(el))"
[ -f "$B/tests/bench_mixed_step" ] && timeout 60 "$B/tests/bench_mixed_step" /tmp/dsq_fullsize 4000 63 2048 512 2 >"$OUT/bench_4k.log" 2>&1; echo "bench 4k rc=$? ($(el))"
timeout "${MEMCHECK_S:-120}" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_cuda_seq_ops" >"$OUT/memcheck.log" 2>&1; echo "memcheck rc=$? ($(el))"
echo "=== summary"
grep -E "^\s+(fork|truncate|64 forks|mixed|copy on)|OK|FAIL|ERROR|PASSED|error|Error" "$OUT/seq_ops.log" | grep -v "^\[ RUN" | head -60
grep -E "RESULT" "$OUT/bench.log" "$OUT/bench_nosplit.log" "$OUT/bench_4k.log"
grep -E "round [0-9] mixed" "$OUT/bench.log" | tail -8
grep -E "PASSED|FAILED|ERROR|rel" "$OUT/e2e.log" | tail -20
tail -3 "$OUT/model.log"
grep -E "PASSED|FAILED" "$OUT/seq_ops_nographs.log"
grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid" "$OUT/memcheck.log" | head -8
