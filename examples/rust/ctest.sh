#!/bin/sh
# ctest driver for the Rust example: build the crate with cargo (offline,
# no dependencies) against $DSQWEN_LIB_DIR, run it on MODEL_DIR and check
# that the first greedy id is WANT (the reference's argmax).  Exits 77 (ctest
# SKIP) when cargo is not installed.
#   ctest.sh CRATE_DIR MODEL_DIR WANT ID [ID...]
crate=$1 model=$2 want=$3
shift 3
if ! command -v cargo >/dev/null 2>&1; then
    echo "SKIP: cargo is not on PATH; the Rust example was not built"
    exit 77
fi
cargo build --offline --quiet --manifest-path "$crate/Cargo.toml" || exit 1
out=$("${CARGO_TARGET_DIR:-$crate/target}/debug/dsqwen-example" "$model" --backend cpu \
      --steps 4 "$@") || exit 1
echo "$out"
case "$out" in
    *"argmax ids: $want "* | *"argmax ids: $want") exit 0 ;;
esac
echo "FAIL: the first greedy id is not $want"
exit 1
