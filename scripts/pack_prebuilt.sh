#!/usr/bin/env bash
# pack_prebuilt.sh - pack a CUDA build made on this (GPU-less) machine for the
# GPU test machine, so a device call spends its minutes on tests instead of
# a 3-4 minute build there.
#
#   cmake -S . -B build-cuda -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DDSQ_CUDA=ON
#   cmake --build build-cuda -j
#   bash scripts/pack_prebuilt.sh build-cuda      # -> .gpu/prebuilt.tar.xz
#
# then carry .gpu (and .deps) with the device call; scripts/gpu_session.sh
# and scripts/gpu_check.sh unpack it into their build directory instead of
# building (PREBUILT=0 builds there anyway).  The archive holds
# libdsqwen.so*, examples/dsqwen, every tests/test_cuda_* and
# tests/bench_* binary: ~6 MB, because xz -9's 64 MiB window stores the
# library once although every test binary links it statically.  The same
# nvcc (13.0) and driver (580) are on both machines; the test data, python
# fixtures and scripts come from the carried working tree, not the archive.
set -euo pipefail
B=${1:-build-cuda}
cd "$(dirname "$0")/.."
[ -f "$B/libdsqwen.so" ] || { echo "pack_prebuilt: no $B/libdsqwen.so (build with -DDSQ_CUDA=ON first)" >&2; exit 1; }
grep -q "DSQ_CUDA:STRING=ON" "$B/CMakeCache.txt" || { echo "pack_prebuilt: $B is not a CUDA build" >&2; exit 1; }
mkdir -p .gpu
files=$(cd "$B" && ls -d libdsqwen.so* examples/dsqwen tests/test_cuda_* tests/bench_* 2>/dev/null | grep -v '\.dir$' || true)
# BASE=DIR (a folder holding another tree's libdsqwen.so* and
# examples/dsqwen): packed as base/ beside them, the same-card baseline
# gpu_session.sh's base_tree uses; one archive stores the two libraries for
# little more than one (a separate .gpu/base.tar.xz is ~15 MB)
if [ -n "${BASE:-}" ]; then
    rm -rf "$B/base" && mkdir -p "$B/base/examples"
    cp -P "$BASE"/libdsqwen.so* "$B/base/" && cp "$BASE/examples/dsqwen" "$B/base/examples/"
    files="$files base"
else
    rm -rf "$B/base"
fi
(cd "$B" && tar cf - $files) | xz -9 -T1 >.gpu/prebuilt.tar.xz.tmp
mv .gpu/prebuilt.tar.xz.tmp .gpu/prebuilt.tar.xz
git rev-parse --short HEAD 2>/dev/null >.gpu/prebuilt.commit || true
# (the commit recorded is the tree's at packing time: rebuild $B first)
echo "pack_prebuilt: .gpu/prebuilt.tar.xz ($(du -h .gpu/prebuilt.tar.xz | cut -f1), $(echo "$files" | wc -w) files;" \
     "tree at packing $(cat .gpu/prebuilt.commit 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes'))"
