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

echo "== build (release) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
echo "== ctest (release) =="
(cd build && ctest --output-on-failure -j"$JOBS")

echo "== build (ASan + UBSan, CPU backend) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDSQ_SANITIZE=ON -DDSQ_CUDA=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
echo "== ctest (ASan + UBSan) =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$JOBS")

echo "== packages: Python, Rust, Go (scripts/test_packages.sh) =="
bash scripts/test_packages.sh
