#!/bin/sh
# Write the ABI baseline of the library at the current commit:
#   tests/abi/dsqwen-VERSION.abi    abidw: exported functions + public types
#   tests/abi/dsqwen-VERSION.types  abi_types.py dump: public struct/enum layouts
# Usage (from the repository root): sh tests/abi/make_baseline.sh VERSION
# Builds a CPU-only release library with -g in build-abi-baseline/.
set -eu
v=$1
cmake -S . -B build-abi-baseline -DDSQ_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DDSQ_ABI_CHECK=ON \
      -DDSQ_BUILD_TESTS=OFF -DDSQ_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-abi-baseline --target dsqwen -j"$(nproc)"
lib=build-abi-baseline/libdsqwen.so
abidw --headers-dir include --drop-private-types --exported-interfaces-only --short-locs \
      --no-corpus-path --no-comp-dir-path --out-file "tests/abi/dsqwen-$v.abi" "$lib"
abidw --headers-dir include --drop-private-types --load-all-types --short-locs \
      --no-corpus-path --no-comp-dir-path --out-file build-abi-baseline/all-types.abi "$lib"
python3 tests/abi/abi_types.py dump build-abi-baseline/all-types.abi > "tests/abi/dsqwen-$v.types"
echo "wrote tests/abi/dsqwen-$v.abi and tests/abi/dsqwen-$v.types from $lib"
