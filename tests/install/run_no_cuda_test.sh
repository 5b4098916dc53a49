#!/bin/sh
# ctest `install_no_cuda_libs`: install the build into a scratch prefix,
# build nocuda_consumer.c against the installed library with pkg-config, and
# run no_cuda_libs.sh on the installed libdsqwen.so (its exit status,
# including 77 = SKIP, is this test's).
#   run_no_cuda_test.sh SRC BIN WORK MODEL_DIR HAVE_CUDA [TOOLKIT_LIBDIR]
set -eu
src=$1 bin=$2 work=$3 model=$4 have_cuda=$5 toolkit=${6:-}
rm -rf "$work"
cmake --install "$bin" --prefix "$work/prefix" >/dev/null
pc=$(find "$work/prefix" -name dsqwen.pc | head -n 1)
libdir=$(dirname "$(dirname "$pc")")
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
# shellcheck disable=SC2046
cc -std=c11 -o "$work/nocuda_consumer" "$src/tests/install/nocuda_consumer.c" \
    $(pkg-config --cflags --libs dsqwen) -lm -Wl,-rpath,"$libdir"
exec sh "$src/tests/install/no_cuda_libs.sh" "$libdir/libdsqwen.so" "$work/nocuda_consumer" \
    "$model" "$have_cuda" "$toolkit"
