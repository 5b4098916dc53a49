#!/bin/sh
# ABI check of the built libdsqwen.so against the committed 0.1.0 baseline
# (tests/abi/README.md: what is checked, how the baseline was made).
# Usage: check_abi.sh LIBRARY BASELINE_PREFIX SUPPRESSIONS HEADERS_DIR WORK_DIR [PYTHON]
#   BASELINE_PREFIX.abi    abidw output (public types, exported functions)
#   BASELINE_PREFIX.types  tests/abi/abi_types.py dump of the public structs/enums
# Fails on any change abidiff reports (exit bits ABIDIFF_ABI_CHANGE = 4 and
# ABIDIFF_ABI_INCOMPATIBLE_CHANGE = 8; bit 8 alone only covers removed
# symbols) that the suppressions do not accept, and on any break of the
# struct/enum rules abi_types.py checks -- unless the SONAME changed.
# Added functions and fields appended to versioned structs pass.
set -u
lib=$1 base=$2 supp=$3 hdrs=$4 work=$5 py=${6:-python3}
here=$(dirname "$0")
for tool in abidiff abidw readelf; do
  if ! command -v $tool >/dev/null 2>&1; then
    echo "check_abi: $tool not found (abigail-tools, binutils: scripts/deps.sh installs them)" >&2
    exit 1
  fi
done
# Without DWARF abidiff compares symbols only and no type change could be
# seen; the build must add -g (CMake option DSQ_ABI_CHECK=ON does).
if ! readelf -S "$lib" | grep -q '\.debug_info'; then
  echo "check_abi: $lib has no debug info; configure with -DDSQ_ABI_CHECK=ON" >&2
  exit 1
fi
new_soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
old_soname=$(sed -n "s/.*<abi-corpus [^>]*soname='\([^']*\)'.*/\1/p" "$base.abi" | head -n 1)
if [ -z "$new_soname" ] || [ -z "$old_soname" ]; then
  echo "check_abi: cannot read the SONAME (library: '$new_soname', baseline: '$old_soname')" >&2
  exit 1
fi
if [ "$new_soname" != "$old_soname" ]; then
  echo "check_abi: SONAME changed from $old_soname to $new_soname: a new major version may break"
  echo "check_abi: the ABI of $old_soname; commit a baseline for the new version (tests/abi/README.md)"
  exit 0
fi

fail=0
echo "== abidiff $(basename "$base").abi $lib"
abidiff --exported-interfaces-only --no-added-syms --suppressions "$supp" "$base.abi" "$lib"
rc=$?
if [ $((rc & 3)) -ne 0 ]; then
  echo "check_abi: abidiff failed to run (exit $rc)" >&2
  exit 1
fi
if [ $((rc & 12)) -ne 0 ]; then
  echo "check_abi: FAIL: abidiff reports ABI changes (exit $rc, report above)" >&2
  fail=1
fi

echo "== public struct and enum layouts"
mkdir -p "$work"
if ! abidw --headers-dir "$hdrs" --drop-private-types --load-all-types --short-locs \
     --no-corpus-path --no-comp-dir-path --out-file "$work/all-types.abi" "$lib"; then
  echo "check_abi: abidw failed on $lib" >&2
  exit 1
fi
"$py" "$here/abi_types.py" dump "$work/all-types.abi" > "$work/new.types" || exit 1
"$py" "$here/abi_types.py" compare "$base.types" "$work/new.types" || fail=1

if [ $fail -ne 0 ]; then
  echo "check_abi: FAIL: the ABI of $new_soname changed incompatibly; keep the old ABI, or bump" >&2
  echo "check_abi: the SONAME major (project VERSION) and commit a new baseline" >&2
  exit 1
fi
echo "check_abi: $lib is ABI-compatible with $(basename "$base") ($new_soname)"
exit 0
