#!/usr/bin/env bash
# The whole test suite: builds the library (with CUDA when nvcc is present:
# kernels compile and link; GPU tests report SKIP without a GPU), runs ctest,
# then builds again CPU-only under AddressSanitizer + UBSan and runs ctest
# there too.  Usage: scripts/test.sh            (from anywhere)
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
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DDSQ_SANITIZE=thread -DDSQ_CUDA=OFF \
      -DDSQ_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-tsan -j"$JOBS" --target test_threads test_cpu_ops
echo "== ctest (TSan: tests labelled threads) =="
NOASLR=""
if command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
  NOASLR="setarch $(uname -m) -R"
fi
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
   $NOASLR ctest -L threads --no-tests=error --output-on-failure -j"$JOBS")

echo "== build (ASan + UBSan, CPU backend) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDSQ_SANITIZE=ON -DDSQ_CUDA=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
echo "== ctest (ASan + UBSan) =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$JOBS")

echo "== packages: Python, Rust, Go (scripts/test_packages.sh) =="
bash scripts/test_packages.sh
