#!/usr/bin/env bash
# The whole test suite: builds the library (with CUDA when nvcc is present:
# kernels compile and link; GPU tests report SKIP without a GPU), runs ctest,
# then builds again CPU-only under AddressSanitizer + UBSan and runs ctest
# there too, and finally runs every libFuzzer target briefly when clang can
# link libFuzzer (DSQ_FUZZ_SECONDS per target, default 10; 0 skips).
# Usage: scripts/test.sh            (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# NVIDIA's toolkit packages install nvcc in /usr/local/cuda/bin without
# putting it on PATH; CMake only finds nvcc on PATH (or via CUDACXX).
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
JOBS=$(nproc)

# The release build also runs abi_compat: abidiff against tests/abi/ (needs -g).
echo "== build (release) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSQ_ABI_CHECK=ON >/dev/null
cmake --build build -j"$JOBS"
echo "== ctest (release) =="
(cd build && ctest --output-on-failure -j"$JOBS")

# TSan: only the thread tests, CPU-only, no target_clones (their ifunc
# resolvers run before the TSan runtime is ready).  ASLR off for the run:
# GCC 12's TSan cannot map its shadow under the high mmap randomisation of
# recent kernels ("unexpected memory mapping").
echo "== build (TSan, CPU backend) =="
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DDSQ_SANITIZE=thread -DDSQ_CUDA=OFF >/dev/null
cmake --build build-tsan -j"$JOBS" --target test_threads test_cpu_ops test_cpu_e2e test_step dsqwen-cli
echo "== ctest (TSan: tests labelled threads) =="
NOASLR=""
if command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
  NOASLR="setarch $(uname -m) -R"
fi
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
   $NOASLR ctest -L threads --no-tests=error --output-on-failure -j"$JOBS")
# `dsqwen serve` (HTTP threads, the scheduler, the output worker) under TSan,
# with the release build's demo model; skipped when serve was not built
if [ -x build-tsan/examples/dsqwen ] && build-tsan/examples/dsqwen serve --help >/dev/null 2>&1; then
  echo "== dsqwen serve under TSan (tests/server/test_server.py http) =="
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $NOASLR \
    python3 tests/server/test_server.py build-tsan/examples/dsqwen build/tests/cli-demo-model http --sanitized
else
  echo "dsqwen serve under TSan: SKIPPED -- built without serve (libmicrohttpd-dev missing)"
fi

echo "== build (ASan + UBSan, CPU backend) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDSQ_SANITIZE=ON -DDSQ_CUDA=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
echo "== ctest (ASan + UBSan) =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$JOBS")

echo "== fuzz (libFuzzer, ${DSQ_FUZZ_SECONDS:-10} s per target) =="
# Each target starts from a scratch copy of its seed corpus (the committed
# seeds stay clean) and runs under ASan + UBSan; any crash, leak, timeout or
# broken invariant fails the script.  Without a clang that links libFuzzer
# the step says so and is skipped (not counted as passed).
FUZZ_SECONDS=${DSQ_FUZZ_SECONDS:-10}
if [ "$FUZZ_SECONDS" = 0 ]; then
  echo "fuzz: skipped (DSQ_FUZZ_SECONDS=0)"
elif ! command -v clang >/dev/null 2>&1 || \
     ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' | \
       clang -x c -fsanitize=fuzzer,address,undefined -o /dev/null - >/dev/null 2>&1; then
  echo "fuzz: SKIPPED -- no clang with libFuzzer (install clang libclang-rt-dev)"
else
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DDSQ_FUZZ=ON -DDSQ_CUDA=OFF -DDSQ_BUILD_EXAMPLES=OFF >/dev/null
  # one target per seed corpus (tests/fuzz/corpus/<name>, as the replay ctests)
  FUZZ_TARGETS=$(ls tests/fuzz/corpus)
  cmake --build build-fuzz -j"$JOBS" --target $(for t in $FUZZ_TARGETS; do printf 'fuzz_%s ' "$t"; done)
  FUZZ_WORK=$(mktemp -d)
  trap 'rm -rf "$FUZZ_WORK"' EXIT
  for t in $FUZZ_TARGETS; do
    mkdir -p "$FUZZ_WORK/$t" "$FUZZ_WORK/artifacts"
    cp tests/fuzz/corpus/"$t"/* "$FUZZ_WORK/$t/"
    extra=""
    [ "$t" = tokenizer ] && extra="-max_len=20000"
    [ "$t" = tokenize_regex ] && extra="-max_len=1024"
    echo "-- fuzz_$t"
    if ! build-fuzz/tests/fuzz_"$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
           -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 $extra \
           -artifact_prefix="$FUZZ_WORK/artifacts/" "$FUZZ_WORK/$t" >"$FUZZ_WORK/$t.log" 2>&1; then
      tail -n 60 "$FUZZ_WORK/$t.log"
      echo "fuzz_$t FAILED; the input is in $FUZZ_WORK/artifacts (kept)"
      trap - EXIT
      exit 1
    fi
    grep -E 'stat::number_of_executed_units|stat::average_exec_per_sec' "$FUZZ_WORK/$t.log" |
      tr '\n' ' ' || true
    echo
  done
fi

echo "== packages: Python, Rust, Go (scripts/test_packages.sh) =="
bash scripts/test_packages.sh
