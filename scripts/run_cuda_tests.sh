#!/usr/bin/env bash
# run_cuda_tests.sh BUILD_DIR [SKIP_REGEX] - run every tests/test_cuda_*
# binary of a build directory directly (what ctest runs for them), for a
# build unpacked from scripts/pack_prebuilt.sh, which has no CMake tree.
# Exit 77 from a test is a skip (no GPU, or a GPU the test cannot use) and
# is reported as such, not as a pass.  Exits with the number of failures.
set -u
B=${1:?build directory}
SKIP=${2:-^$}
n=0 f=0 s=0
for t in "$B"/tests/test_cuda_*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "$name" | grep -qE "$SKIP" && continue
    n=$((n + 1))
    timeout 120 "$t" >"$t.log" 2>&1
    r=$?
    if [ $r = 0 ]; then
        echo "ok      $name"
    elif [ $r = 77 ]; then
        s=$((s + 1))
        echo "SKIPPED $name: $(grep -m1 -i skip "$t.log")"
    else
        f=$((f + 1))
        echo "*** FAILED (rc $r) $name"
        tail -20 "$t.log"
    fi
done
echo "$((n - f - s)) of $n tests passed, $s skipped, $f failed"
exit $f
