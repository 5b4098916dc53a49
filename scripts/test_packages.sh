#!/usr/bin/env bash
# The language packages, built and tested as their users get them, against a
# CPU-only libdsqwen (no GPU in CI; the CUDA build is covered by ctest):
#   Python  `pip install .` into a venv (Debian's python3 with
#           --system-site-packages: setuptools, cffi, pytest from deps.sh;
#           --no-build-isolation keeps it offline), then pytest tests/python
#           against the installed package.
#   Rust    the library that pip's build made, installed into a scratch
#           prefix; `cargo test --offline` in bindings/rust through pkg-config.
#   Go      `go test` in bindings/go through `#cgo pkg-config: dsqwen`.
# The environment set here (PKG_CONFIG_PATH, LD_LIBRARY_PATH) is what a
# library installed off the default prefix needs; see README "Packages".
# Usage: scripts/test_packages.sh   (after scripts/deps.sh; test.sh calls it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/build-packages
rm -rf "$WORK"
mkdir -p "$WORK"
# Debian's interpreter: the one deps.sh installed python3-cffi etc. for,
# whatever python3 is first on PATH
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
t0=$(date +%s)

echo "== Python: pip install . (CPU-only library) =="
"$PY" -m venv --system-site-packages "$WORK/venv"
CMAKE_ARGS="-DDSQ_CUDA=OFF" "$WORK/venv/bin/python" -m pip install --no-build-isolation --no-deps \
    --no-index --quiet "$ROOT"
echo "== Python: pytest =="
(cd "$WORK" && "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/python")
t1=$(date +%s)

echo "== install the library into a scratch prefix =="
cmake --install "$ROOT/build-python/cmake" --prefix "$WORK/prefix" >/dev/null
pc=$(find "$WORK/prefix" -name dsqwen.pc | head -n 1)
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
export LD_LIBRARY_PATH
LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

echo "== Rust: cargo test (dsqwen-sys, dsqwen) =="
CARGO_TARGET_DIR="$WORK/cargo" cargo test --offline --quiet --manifest-path "$ROOT/bindings/rust/Cargo.toml"
t2=$(date +%s)

echo "== Go: go test (bindings/go) =="
(cd "$ROOT/bindings/go" && GOFLAGS=-mod=mod GOPROXY=off go test -count=1 ./...)
t3=$(date +%s)
echo "packages: Python $((t1 - t0)) s, Rust $((t2 - t1)) s, Go $((t3 - t2)) s"
