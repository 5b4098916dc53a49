#!/usr/bin/env bash
# Install the Debian packages libdsqwen needs to build and test, if missing.
# The CUDA toolkit is not a Debian package here: when nvcc is absent the build
# is CPU-only (the CMake option DSQ_CUDA=AUTO decides).
set -euo pipefail
PKGS="cmake make gcc pkg-config python3 python3-numpy libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev"
# clang + its runtime libraries (libFuzzer, ASan/UBSan for clang) for the
# short fuzzing runs in scripts/test.sh
PKGS="$PKGS clang libclang-rt-dev"
# nvcc compiles .cu host code with g++, which a fresh Debian lacks
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  PKGS="$PKGS g++"
fi
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps.sh: installing:$missing"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
