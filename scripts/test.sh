#!/usr/bin/env bash
# The whole test suite: builds the library (with CUDA when nvcc is present:
# kernels compile and link; GPU tests report SKIP without a GPU), runs ctest,
# then builds again CPU-only under AddressSanitizer + UBSan and runs ctest
# there too.  Usage: scripts/test.sh            (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
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
