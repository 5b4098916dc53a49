#!/usr/bin/env bash
# Install the Debian packages libdsqwen needs to build and test, if missing.
# The CUDA toolkit is not a Debian package here: when nvcc is absent the build
# is CPU-only (the CMake option DSQ_CUDA=AUTO decides).
set -euo pipefail
PKGS="cmake make gcc pkg-config python3 libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev"
# the language packages (scripts/test_packages.sh): Python venv + pip install,
# cffi and pytest for its tests; Rust and Go toolchains (Debian's, offline)
PKGS="$PKGS python3-venv python3-pip python3-setuptools python3-cffi python3-pytest cargo golang-go"
# line editing and history in `dsqwen chat` (optional: without it, plain input)
PKGS="$PKGS libedit-dev"
# `dsqwen serve` (optional: without libmicrohttpd it is not built and its
# tests skip); curl drives it in tests/server/test_server.py, which installs
# the `openai` client from PyPI into a venv of the build tree
PKGS="$PKGS libmicrohttpd-dev curl"
# clang + its runtime libraries (libFuzzer, ASan/UBSan for clang) for the
# short fuzzing runs in scripts/test.sh
PKGS="$PKGS clang libclang-rt-dev"
# nvcc compiles .cu host code with g++, which a fresh Debian lacks
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  PKGS="$PKGS g++"
fi
# abidiff/abidw for the ABI check (tests/abi/), binutils for readelf
PKGS="$PKGS abigail-tools binutils"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps.sh: installing:$missing"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  # Wait (up to 10 min) for another apt/dpkg (e.g. unattended-upgrades on a
  # fresh machine) to release its lock instead of failing at once.
  LOCK_WAIT="-o DPkg::Lock::Timeout=600"
  # apt-get update also takes the package lists' lock, which that timeout
  # does not cover on every apt version: retry while that lock is held.
  for try in $(seq 60); do
    if err=$($SUDO apt-get $LOCK_WAIT update -qq 2>&1); then break; fi
    case "$err" in
      *"Could not get lock"*|*"Unable to lock"*) ;;
      *) echo "$err" >&2; exit 1 ;;
    esac
    [ "$try" -lt 60 ] || { echo "$err" >&2; exit 1; }
    echo "deps.sh: another apt holds its lock; waiting..." >&2
    sleep 10
  done
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get $LOCK_WAIT install -y -qq $missing >/dev/null
fi
