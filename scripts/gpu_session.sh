#!/usr/bin/env bash
# gpu_session.sh - the GPU work a session owes, in calls that each fit the
# device tool's 10-minute limit (30 device minutes a session in all).  Run
# from the repository root on the H200 with .deps/ carried
# (scripts/fetch_device_deps.sh makes it):
#
#   bash scripts/gpu_session.sh check   # build, GPU kernel/e2e tests, the
#                                       # full-size check vs HF, every ctest
#   bash scripts/gpu_session.sh check2  # 7B-shape check vs HF, quantized
#                                       # full-size check vs HF
#   bash scripts/gpu_session.sh quant   # the quantized full-size check alone
#                                       # (issue 10: AWQ + int8 head memory,
#                                       # INT8 / Q4 and at-load rows)
#   bash scripts/gpu_session.sh sanitize # compute-sanitizer memcheck/racecheck
#   bash scripts/gpu_session.sh first   # one call when device time is short:
#                                       # the GPU tests of the newest kernels,
#                                       # the bench rows deciding their
#                                       # defaults, other tests (prebuilt only)
#   bash scripts/gpu_session.sh qrows   # the quantized products' defaults:
#                                       # tests, bench rows, bf16 baseline
#   bash scripts/gpu_session.sh tile    # quantized prompts: the dequantization
#                                       # tile's test, prefill rows, profile,
#                                       # argmax misses' margins
#   bash scripts/gpu_session.sh tune    # cuBLASLt tuning (DSQ_CUDA_GEMM_TUNE):
#                                       # its tests, table, bench pairs
#   bash scripts/gpu_session.sh pieces  # decode graphs launched in pieces
#                                       # (DSQ_CUDA_GRAPH_PIECES): tests, bench
#                                       # pairs, a sampled-step timeline
#   bash scripts/gpu_session.sh early   # early PDL triggers (DSQ_CUDA_PDL_EARLY):
#                                       # tests, default/none pairs, split
#                                       # caps and a timeline at 8,192 keys
#   bash scripts/gpu_session.sh prompt  # short prompts: prefill attention rows,
#                                       # TTFT bench rows, the mixed step
#                                       # (against .gpu/base.tar.xz if present)
#   bash scripts/gpu_session.sh prompt2 # the mixed step and the prefill profile
#                                       # against .gpu/base.tar.xz
#   bash scripts/gpu_session.sh bench   # dsqwen bench: the issue-7/8 table
#   bash scripts/gpu_session.sh serve   # the issue-13 load test (bench_serve.sh)
#   bash scripts/gpu_session.sh profile # per-kernel GPU time per decode step
#                                       # (bf16 / INT8 / 4-bit weights; issues 8, 10)
#   bash scripts/gpu_session.sh direct  # one-split decode attention without
#                                       # the merge launch: tests, bench rows
#   bash scripts/gpu_session.sh q4gemv  # 4-bit products of 1-2 rows (gemv.cu's
#                                       # GEMV, the split fill): tests, the
#                                       # default against stop 38's path
#   bash scripts/gpu_session.sh rows58  # 2-8 rows: down on cuBLASLt from 5
#                                       # rows, the products' table, profile
#   bash scripts/gpu_session.sh rows24  # 2-4 rows: where the tensor-core GEMV
#                                       # and cuBLASLt's down start, the norm
#   bash scripts/gpu_session.sh qmma44  # stop 44: the quantized tensor-core
#                                       # GEMV as the default: tests, rows
#   bash scripts/gpu_session.sh s47     # stop 47: decode attention's lean
#                                       # cp.async, 3 blocks per SM, bulk rows
#   bash scripts/gpu_session.sh s46b    # stop 46: s46a's deciding parts, short
#   bash scripts/gpu_session.sh s46a    # stop 46: the bulk-copy decode loader:
#                                       # tests, bench pairs, ncu, sanitizers
#   bash scripts/gpu_session.sh s45     # stop 45: the decode merge in the
#                                       # decode blocks; stop 44's unrun pieces
#   bash scripts/gpu_session.sh final44 # stop 44's final quantized defaults
#   bash scripts/gpu_session.sh long44  # stop 44: down on that GEMV (16 warps),
#                                       # the INT8 head, a 4-bit timeline
#   bash scripts/gpu_session.sh start42 # stop 42: every CUDA test, the mma
#                                       # knobs' tests and table, a profile
#   bash scripts/gpu_session.sh bench42 # stop 42: the mma unroll knob's bench
#                                       # rows beside the defaults
#   bash scripts/gpu_session.sh final42 # stop 42's final tree: every CUDA
#                                       # test, rows beside the old unroll
#   bash scripts/gpu_session.sh mmanorm42 # branch mma-norm: the norm folded
#                                       # into qkv's tensor-core GEMV at 4-8 rows
#   bash scripts/gpu_session.sh defaults41 # stop 41's small-batch defaults:
#                                       # every CUDA test, rows beside the old
#   bash scripts/gpu_session.sh defaults40 # stop 40's new defaults: tests,
#                                       # rows beside the old paths
#   bash scripts/gpu_session.sh sampdraw # the top-p draw's block rank search:
#                                       # same tokens as the base tree, timing
#   bash scripts/gpu_session.sh samp    # GPU sampling at 64 / 256 rows with
#                                       # clusters forced: timing, bench rows
#   bash scripts/gpu_session.sh fuzz    # the slow libFuzzer targets on all
#                                       # cores (issue 14's 10M executions)
#
# Order by value when device time is short: check, bench, quant, profile,
# check2, serve, sanitize, fuzz.
#
# Build here first and carry the binaries: `bash scripts/pack_prebuilt.sh
# <cuda build dir>` writes .gpu/prebuilt.tar.xz; carried with .gpu, every
# stage unpacks it instead of building on the device (3-4 of the 10 minutes
# a call allows), and `check` runs the test_cuda_* binaries directly
# (scripts/run_cuda_tests.sh) in place of ctest.  PREBUILT=0 builds anyway.
#
# Each stage writes logs under $OUT (default /tmp/gpu_session/<stage>) and
# prints a short table last; with PACK=1 (the default) the stage's folder is
# then packed into one $OUT.tgz (the device tool returns only a few files).
# The stages share nothing but the build directory, so a fresh machine may
# run any of them first.
#
# FUZZ_BG=<target> (tokenize, tokenize_regex, ...) runs that libFuzzer target
# in the background of any stage, on FUZZ_BG_JOBS (12) jobs at nice 19 for
# FUZZ_BG_SECONDS (540): the GPU stages leave most of the 16 cores idle
# (fuzz_tokenize: ~1,050 exec/s per job with 15 jobs, so one call's run stays
# under 10M executions -- 8.5M in 540 s on 2026-12-04).  Binaries
# from .fuzzbin/ (built elsewhere with -DDSQ_FUZZ=ON, carried), or built
# here with clang; the run's corpus starts from tests/fuzz/corpus/<target>
# plus .fuzzcorp/<target> when carried, and comes back packed in $OUT.
set -u
stage=${1:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/gpu_session}/$stage
B=${BUILD_DIR:-/tmp/gs_build}
mkdir -p "$OUT"
[ -d .deps ] && source scripts/device_env.sh
export DSQ_TEST_DATA=$ROOT/tests/data
# NCCL for the tensor-parallel tests: the toolkit's, else the one that came
# with torch (pip's nvidia-nccl); libdsqwen opens libnccl.so.2 at run time
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
    NC=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
    [ -n "$NC" ] && export LD_LIBRARY_PATH=$NC${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }

# A build made elsewhere (scripts/pack_prebuilt.sh -> .gpu/prebuilt.tar.xz,
# carried) is unpacked into $B instead of building here; PREBUILT=0 builds.
prebuilt() {
    [ "${PREBUILT:-1}" != 0 ] && [ -f .gpu/prebuilt.tar.xz ] || return 1
    if [ ! -f "$B/.prebuilt_unpacked" ]; then
        mkdir -p "$B" && tar xJf .gpu/prebuilt.tar.xz -C "$B" && touch "$B/.prebuilt_unpacked" || return 1
        echo "== prebuilt binaries of $(cat .gpu/prebuilt.commit 2>/dev/null || echo '?') unpacked into $B ($(el))"
    fi
    # the CLI's RUNPATH names the build directory it was linked in (e.g.
    # /tmp/cbuild), not $B: without this it cannot load libdsqwen.so.0
    case ":${LD_LIBRARY_PATH:-}:" in *":$B:"*) ;; *) export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;; esac
    return 0
}

build() { # targets...
    prebuilt && return 0
    timeout 420 bash -c "cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DDSQ_CUDA=ON \
        >>$OUT/build.log 2>&1 && cmake --build $B -j16 ${*:+--target} $* >>$OUT/build.log 2>&1"
    local rc=$?
    echo "== build rc=$rc ($(el))"
    [ $rc = 0 ] || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
}

fullsize_model() { # the random-weight model of the exact 1.5B shape, seeded
    M=/tmp/dsq_fullsize
    if [ -f $M/model.safetensors ]; then # fullsize_check.py's (check) lacks the tokenizer
        for f in tokenizer.json tokenizer_config.json generation_config.json; do
            [ -f $M/$f ] || cp tests/data/model/$f $M/
        done
        return
    fi
    timeout 300 python3 - <<PY >"$OUT/model.log" 2>&1
import sys, shutil
sys.path.insert(0, "$ROOT/tests/fixtures")
from fullsize_check import build_model
build_model("$ROOT/tests/data/model/config.json", "$M", 20240601)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy("$ROOT/tests/data/model/" + f, "$M/" + f)
print("model ready")
PY
    echo "== model rc=$? ($(tail -1 "$OUT/model.log")) ($(el))"
}

# The prebuilt-only stages' start: the binaries unpacked (or exit), the
# full-size model made in the background ($MODEL_PID, into $M).
prebuilt_stage() {
    prebuilt || { echo "$1: needs .gpu/prebuilt.tar.xz (scripts/pack_prebuilt.sh)"; exit 1; }
    M=/tmp/dsq_fullsize
    ( fullsize_model ) &
    MODEL_PID=$!
}

fuzz_bg_start() { # FUZZ_BG: one target, many jobs, beside the stage's GPU work
    [ -n "${FUZZ_BG:-}" ] || return 0
    local t=$FUZZ_BG fb=$ROOT/.fuzzbin
    if [ ! -x "$fb/fuzz_$t" ] && command -v clang >/dev/null 2>&1; then
        cmake -S . -B /tmp/gs_fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSQ_FUZZ=ON \
            -DDSQ_CUDA=OFF -DDSQ_BUILD_EXAMPLES=OFF >"$OUT/fuzzbg_build.log" 2>&1 &&
            cmake --build /tmp/gs_fuzz -j8 --target fuzz_$t >>"$OUT/fuzzbg_build.log" 2>&1 && fb=/tmp/gs_fuzz/tests
    fi
    if [ ! -x "$fb/fuzz_$t" ]; then
        echo "== fuzz_bg: no fuzz_$t binary (carry .fuzzbin/ or install clang): not run"
        return 0
    fi
    local extra=""
    [ "$t" = tokenize_regex ] && extra="-max_len=1024"
    [ "$t" = tokenizer ] && extra="-max_len=20000"
    FBG=$OUT/fuzzbg
    mkdir -p "$FBG/corpus" "$FBG/art" "$FBG/run"
    cp tests/fuzz/corpus/$t/* "$FBG/corpus/" 2>/dev/null
    [ -d .fuzzcorp/$t ] && cp -n .fuzzcorp/$t/* "$FBG/corpus/" 2>/dev/null
    (cd "$FBG/run" && DSQ_FUZZ_TOKENIZER=$ROOT/tests/data/model/tokenizer.json nice -n 19 "$fb/fuzz_$t" \
        -jobs=${FUZZ_BG_JOBS:-12} -workers=${FUZZ_BG_JOBS:-12} -max_total_time=${FUZZ_BG_SECONDS:-540} -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 $extra -artifact_prefix="$FBG/art/" \
        "$FBG/corpus" >"$FBG/fuzz.log" 2>&1) &
    FBG_PID=$!
    echo "== fuzz_bg: fuzz_$t, ${FUZZ_BG_JOBS:-12} jobs, ${FUZZ_BG_SECONDS:-540} s, corpus $(ls "$FBG/corpus" | wc -l)"
}

fuzz_bg_end() {
    [ -n "${FBG_PID:-}" ] || return 0
    wait "$FBG_PID" 2>/dev/null # (the fuzz stage may have waited for it already)
    local total rate
    total=$(grep -h "stat::number_of_executed_units" "$FBG/run"/fuzz-*.log 2>/dev/null | awk '{s += $2} END {print s + 0}')
    rate=$(grep -h "stat::average_exec_per_sec" "$FBG/run"/fuzz-*.log 2>/dev/null | awk '{s += $2} END {print s + 0}')
    echo "== fuzz_bg fuzz_$FUZZ_BG: executions $total (all jobs), exec/s $rate, corpus $(ls "$FBG/corpus" | wc -l)," \
         "artifacts $(ls "$FBG/art" | wc -l), job logs with findings" \
         "$(grep -lE "ERROR|deadly|leak" "$FBG/run"/fuzz-*.log 2>/dev/null | wc -l) ($(el))"
}

# One `dsqwen bench` row (BENCH_ONLY=regex: only the rows whose name
# matches; DEADLINE=s: none started after s seconds of the stage).
# the bench table's header line; bench_start first waits for the stage's
# model (prebuilt_stage's background job)
bench_header() { echo "== dsqwen bench (batch prompt prefill_t/s prefill_ms steps ms/step decode_t/s step0_ms floor%)"; }
bench_start() {
    wait $MODEL_PID
    bench_header
}

# BENCH_BW=GBPS: floor% against that bandwidth (dsqwen bench --bandwidth;
# default the H200's measured 4,480)
bench_row() { # name prompt_len batch args...
    local name=$1 plen=$2 batch=$3
    shift 3
    if [ -n "${BENCH_ONLY:-}" ] && ! [[ $name =~ $BENCH_ONLY ]]; then return 0; fi
    if [ $(( $(date +%s) - T0 )) -ge "${DEADLINE:-1000000}" ]; then
        printf "%-22s not run (the stage's %s s deadline)\n" "$name" "$DEADLINE"
        return 0
    fi
    timeout 150 "$B/examples/dsqwen" bench --model $M --prompt-len $plen --max-tokens 64 --batch $batch \
        ${BENCH_BW:+--bandwidth $BENCH_BW} "$@" \
        >"$OUT/$name.log" 2>&1
    printf "%-22s rc=%s %s\n" "$name" $? "$(grep -E "^ *$batch +$plen " "$OUT/$name.log" | tail -1)"
}

# The base tree's binaries (.gpu/base.tar.xz, built elsewhere like the
# prebuilt ones: a same-card baseline) unpacked once into /tmp/gs_base;
# returns 1 where none was carried.
base_tree() {
    [ -f /tmp/gs_base/.unpacked ] && return 0
    if [ ! -f .gpu/base.tar.xz ] && prebuilt && [ -f "$B/base/libdsqwen.so" ]; then
        # packed inside prebuilt.tar.xz (pack_prebuilt.sh with BASE=DIR)
        rm -rf /tmp/gs_base && cp -a "$B/base" /tmp/gs_base && touch /tmp/gs_base/.unpacked
        return 0
    fi
    [ -f .gpu/base.tar.xz ] || return 1
    mkdir -p /tmp/gs_base && tar xJf .gpu/base.tar.xz -C /tmp/gs_base && touch /tmp/gs_base/.unpacked
}

# bench_row with the base tree's binaries
base_row() { LD_LIBRARY_PATH=/tmp/gs_base:$LD_LIBRARY_PATH B=/tmp/gs_base bench_row "$@"; }

# Two more trees' binaries for one stage, from .gpu/trees.tar.xz (base/
# and alt/, library + CLI each; one archive, so that xz stores the two
# libraries' common bytes once and the carry stays under its limit):
# base_row (redefined) and alt_row run bench_row with them.
two_trees() { # stage name
    [ -f .gpu/trees.tar.xz ] || { echo "$1: needs .gpu/trees.tar.xz"; exit 1; }
    mkdir -p /tmp/gs_trees && tar xJf .gpu/trees.tar.xz -C /tmp/gs_trees
    base_row() { LD_LIBRARY_PATH=/tmp/gs_trees/base:$LD_LIBRARY_PATH B=/tmp/gs_trees/base bench_row "$@"; }
    alt_row() { LD_LIBRARY_PATH=/tmp/gs_trees/alt:$LD_LIBRARY_PATH B=/tmp/gs_trees/alt bench_row "$@"; }
}

# bench_mixed_step (63 decodes at 1,024 + a 2,048-token prompt in 512-token
# chunks) with the build in $2 and the environment settings after it, into
# $OUT/mixed_$1.log; prints its RESULT lines
mixed_row() { # tag build_dir [env...]
    local tag=$1 BB=$2
    shift 2
    env "$@" LD_LIBRARY_PATH=$BB:$LD_LIBRARY_PATH timeout 75 "$BB/tests/bench_mixed_step" $M 1024 63 2048 512 5 \
        >"$OUT/mixed_$tag.log" 2>&1
    echo "== mixed $tag rc=$? $*"
    grep -E "RESULT (plain|mixed|decode)" "$OUT/mixed_$tag.log"
}

# test_cuda_quant and _quant_e2e, a line each, then their lines matching
# the regex $1 (the qrows / tile stages)
quant_tests() {
    for t in test_cuda_quant test_cuda_quant_e2e; do
        timeout 100 "$B/tests/$t" >"$OUT/$t.log" 2>&1
        printf "%-22s rc=%s (%s) %s\n" $t $? "$(el)" "$(grep -E "PASSED|FAILED" "$OUT/$t.log" | tail -1)"
    done
    grep -E "$1" "$OUT"/test_cuda_quant*.log | sed 's/^.*log://' | head -30
}

# quant_fullsize_check.py for the formats $1 at batch 1, if at least 120 s
# of the stage's DEADLINE are left
qfull_rows() {
    local left=$(( DEADLINE - $(date +%s) + T0 ))
    if [ $left -ge 120 ]; then
        DSQWEN_LIBRARY=$B/libdsqwen.so timeout $left python3 tests/fixtures/quant_fullsize_check.py \
            --formats "$1" --config tests/data/model/config.json --dir /tmp/dsq_qfull --out "$OUT" \
            --batches 1 --speed-steps 16 --cleanup --reuse >"$OUT/quant_fullsize.log" 2>&1
        echo "== quant_fullsize rc=$? ($(el))"; grep -v "^ \|Loading" "$OUT/quant_fullsize.log" | tail -12
    else
        echo "== quant_fullsize: not run ($left s left of the deadline)"
    fi
}

# gtest name [VAR=value...]: one test_cuda_* binary (under env), its result
# in one line; not run past $DEADLINE (seconds from the stage's start).
# Its log: $OUT/<name><LOGSUFFIX>.log.
gtest() {
    local name=$1
    shift
    local log="$OUT/$name${LOGSUFFIX:-}.log"
    if [ $(( $(date +%s) - T0 )) -ge "${DEADLINE:-540}" ]; then echo "$name: not run (deadline)"; return; fi
    env "$@" timeout "${GTEST_TIMEOUT:-100}" "$B/tests/$name" >"$log" 2>&1
    local r=$?
    local what
    what=$(grep -E "PASSED|FAILED" "$log" | tail -1)
    [ $r = 77 ] && what="SKIPPED: $(grep -m1 -i skip "$log")"
    printf "%-26s rc=%s (%s) %s %s\n" "$name" $r "$(el)" "$*" "$what"
    [ $r = 0 ] || [ $r = 77 ] || grep -E "ERROR|FAIL|error" "$log" | head -8
}

case "$stage" in
check | check2 | sanitize | bench | serve | profile | fuzz | first | qrows | tile | tune | pieces | early | prompt | prompt2) fuzz_bg_start ;;
esac

case "$stage" in
direct)
    # stop 39 (run at stop 40, now the default): decode attention launches
    # planned at one split per sequence (batches of ~100+) writing their
    # output in the decode kernel, no merge launch ("direct" rows) against
    # the merge kernel (DSQ_CUDA_DECODE_DIRECT=0, "merge" rows).  The
    # attention tests (one split's direct output bit-identical to the
    # merge's), the e2e and greedy-step tests with it on, bench rows
    # interleaved.  Prebuilt only.
    prebuilt_stage direct
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=200 gtest test_cuda_attention
    grep -E "direct output|DIFFERENT|FAIL" "$OUT/test_cuda_attention.log" | head -20
    gtest test_cuda_e2e DSQ_CUDA_DECODE_DIRECT=1
    gtest test_cuda_step_greedy DSQ_CUDA_DECODE_DIRECT=1
    bench_start
    for rep in 1 2; do
        DSQ_CUDA_DECODE_DIRECT=1 bench_row direct_b256_int8_r$rep 1024 256 --kv int8
        DSQ_CUDA_DECODE_DIRECT=0 bench_row merge_b256_int8_r$rep 1024 256 --kv int8
    done
    DSQ_CUDA_DECODE_DIRECT=1 bench_row direct_b128_f16 1024 128 --kv f16
    DSQ_CUDA_DECODE_DIRECT=0 bench_row merge_b128_f16 1024 128 --kv f16
    DSQ_CUDA_DECODE_DIRECT=1 bench_row direct_b256_f16 1024 256 --kv f16
    DSQ_CUDA_DECODE_DIRECT=0 bench_row merge_b256_f16 1024 256 --kv f16
    DSQ_CUDA_DECODE_DIRECT=1 bench_row direct_b256_int8_none 1024 256 --kv int8 --sampling none
    DSQ_CUDA_DECODE_DIRECT=0 bench_row merge_b256_int8_none 1024 256 --kv int8 --sampling none
    DSQ_CUDA_DECODE_DIRECT=1 bench_row direct_b64 1024 64 --kv f16
    ;;
rows58)
    # stop 41: down (K = 8,960) on cuBLASLt from 5 rows (DSQ_CUDA_GEMV_LONG_MIN,
    # default 5; 0 = the FMA GEMV as before), measured at stop 41's second
    # call as DSQ_CUDA_GEMV_LONG=gemm (the tag mmasplit-stop41's knob).  The
    # dispatch test, the 1-8-row timing table, e2e / greedy tests, a
    # sampled batch-8 profile with the tensor-core GEMV at its default and
    # at 256 threads (DSQ_CUDA_GEMV_MMA_NT), and bench rows at 2-8 rows
    # for the row counts where each kernel starts.
    prebuilt_stage rows58
    DEADLINE=${DEADLINE:-560}
    LOGSUFFIX=_dispatch gtest test_cuda_kernels DSQ_TEST_FILTER=test_linear_dispatch
    grep -E "dsq_cu_linear K=" "$OUT/test_cuda_kernels_dispatch.log"
    LOGSUFFIX=_timing GTEST_TIMEOUT=200 gtest test_cuda_kernels DSQ_TEST_FILTER=test_small_rows_timing
    grep -A45 "products at 1-8 rows" "$OUT/test_cuda_kernels_timing.log" | grep -E "^  [a-z]" | awk '$3 >= 3 || $2 == "T"'
    gtest test_cuda_e2e
    gtest test_cuda_step_greedy
    wait $MODEL_PID
    export PYTHONUNBUFFERED=1
    for nt in 0 256; do
        DSQ_CUDA_GEMV_MMA_NT=$nt DSQWEN_LIBRARY=$B/libdsqwen.so timeout 90 python3 tests/bench/kernel_profile.py \
            --model $M --batch 8 --context 512 --sample --json "$OUT/prof_b8_nt$nt.json" >"$OUT/prof_b8_nt$nt.log" 2>&1
        echo "== profile b8 nt=$nt rc=$?"
        sed -n '/^timeline/,$p' "$OUT/prof_b8_nt$nt.log" | head -20
    done
    bench_header
    for rep in 1 2; do
        bench_row b8_r$rep 512 8 --kv f16
        DSQ_CUDA_GEMV_LONG_MIN=0 bench_row gemv_b8_r$rep 512 8 --kv f16
    done
    bench_row b5 512 5 --kv f16
    DSQ_CUDA_GEMV_MMA=6 bench_row fma_b5 512 5 --kv f16
    bench_row b4 512 4 --kv f16
    DSQ_CUDA_GEMV_LONG_MIN=4 bench_row long_b4 512 4 --kv f16
    DSQ_CUDA_GEMV_MMA=4 bench_row mma_b4 512 4 --kv f16
    bench_row b3 512 3 --kv f16
    DSQ_CUDA_GEMV_LONG_MIN=3 bench_row long_b3 512 3 --kv f16
    bench_row b2 512 2 --kv f16
    DSQ_CUDA_GEMV_LONG_MIN=2 bench_row long_b2 512 2 --kv f16
    ;;
rows24)
    # stop 41: at 2-4 rows, where the tensor-core GEMV (DSQ_CUDA_GEMV_MMA,
    # default from 5 rows) and down on cuBLASLt (DSQ_CUDA_GEMV_LONG_MIN,
    # default 5) start, and the FMA GEMV's folded norm (DSQ_CUDA_NORM_FUSE=0:
    # its own kernel); rows58's batch-4 row had MMA from 4 rows 8% faster.
    # Bench rows interleaved, two runs of each; a batch-4 profile each way.
    prebuilt_stage rows24
    DEADLINE=${DEADLINE:-560}
    wait $MODEL_PID
    export PYTHONUNBUFFERED=1
    for mm in 5 4; do
        DSQ_CUDA_GEMV_MMA=$mm DSQWEN_LIBRARY=$B/libdsqwen.so timeout 90 python3 tests/bench/kernel_profile.py \
            --model $M --batch 4 --context 512 --sample --json "$OUT/prof_b4_mma$mm.json" >"$OUT/prof_b4_mma$mm.log" 2>&1
        echo "== profile b4 mma_min=$mm rc=$?"
        sed -n '/^timeline/,$p' "$OUT/prof_b4_mma$mm.log" | head -16
    done
    bench_header
    for rep in 1 2; do
        bench_row b4_r$rep 512 4 --kv f16
        DSQ_CUDA_GEMV_MMA=4 bench_row mma4_b4_r$rep 512 4 --kv f16
        DSQ_CUDA_GEMV_MMA=4 DSQ_CUDA_GEMV_LONG_MIN=4 bench_row mma4long4_b4_r$rep 512 4 --kv f16
        DSQ_CUDA_NORM_FUSE=0 bench_row nofuse_b4_r$rep 512 4 --kv f16
        bench_row b3_r$rep 512 3 --kv f16
        DSQ_CUDA_GEMV_MMA=3 bench_row mma3_b3_r$rep 512 3 --kv f16
        DSQ_CUDA_GEMV_MMA=3 DSQ_CUDA_GEMV_LONG_MIN=3 bench_row mma3long3_b3_r$rep 512 3 --kv f16
        DSQ_CUDA_NORM_FUSE=0 bench_row nofuse_b3_r$rep 512 3 --kv f16
        bench_row b2_r$rep 512 2 --kv f16
        DSQ_CUDA_GEMV_MMA=2 bench_row mma2_b2_r$rep 512 2 --kv f16
        DSQ_CUDA_NORM_FUSE=0 bench_row nofuse_b2_r$rep 512 2 --kv f16
    done
    bench_row b1 512 1 --kv f16
    DSQ_CUDA_NORM_FUSE=0 bench_row nofuse_b1 512 1 --kv f16
    DSQ_CUDA_GEMV_MMA=4 DSQ_CUDA_GEMV_LONG_MIN=4 bench_row mma4long4_b8 512 8 --kv f16
    bench_row b8 512 8 --kv f16
    ;;
defaults41)
    # stop 41's small-batch defaults as the default build: the tensor-core
    # GEMV from 4 rows, down on cuBLASLt from 4 rows, the norm folded at 1
    # row only.  Every test_cuda_* binary, then bench rows beside the old
    # defaults (DSQ_CUDA_GEMV_MMA=5 DSQ_CUDA_GEMV_LONG_MIN=0
    # DSQ_CUDA_NORM_FUSE=4, "old" rows), interleaved.
    prebuilt_stage defaults41
    DEADLINE=${DEADLINE:-560}
    bash scripts/run_cuda_tests.sh $B 2>&1 | tee "$OUT/cuda_tests.log" | grep -vE "^ok " | tail -30
    grep -E "dsq_cu_linear K=" $B/tests/test_cuda_kernels.log
    echo "== tests done ($(el))"
    wait $MODEL_PID
    bench_header
    for b in 1 2 3 4 5 8; do
        bench_row b${b} 512 $b --kv f16
        DSQ_CUDA_GEMV_MMA=5 DSQ_CUDA_GEMV_LONG_MIN=0 DSQ_CUDA_NORM_FUSE=4 bench_row old_b${b} 512 $b --kv f16
    done
    bench_row b8_none 512 8 --kv f16 --sampling none
    bench_row b4_q8h 512 4 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_GEMV_MMA=5 DSQ_CUDA_GEMV_LONG_MIN=0 DSQ_CUDA_NORM_FUSE=4 bench_row old_b4_q8h 512 4 --kv f16 \
        --quantize int8 --quantize-head
    bench_row b8_8192 8192 8 --kv f16
    ;;
gu38)
    # stop 41: gate/up and the head at 3-8 rows on the tensor-core GEMV at
    # 256 threads (SiLU*mul in its epilogue, PDL) instead of cuBLASLt +
    # silu_mul (DSQ_CUDA_GEMV_MAX=8 with DSQ_CUDA_GEMV_MMA_NT=256; the
    # product table has them even: gate/up at 8 rows 23.9 vs 23.8 us).
    prebuilt_stage gu38
    DEADLINE=${DEADLINE:-560}
    gtest test_cuda_e2e DSQ_CUDA_GEMV_MAX=8 DSQ_CUDA_GEMV_MMA_NT=256
    wait $MODEL_PID
    bench_header
    for rep in 1 2; do
        for b in 3 4 8; do
            bench_row b${b}_r$rep 512 $b --kv f16
            DSQ_CUDA_GEMV_MAX=8 DSQ_CUDA_GEMV_MMA_NT=256 bench_row gu_b${b}_r$rep 512 $b --kv f16
        done
    done
    DSQ_CUDA_GEMV_MAX=8 bench_row gu128_b8 512 8 --kv f16
    ;;
final41)
    # stop 41's defaults together (defaults41 + gate/up and the head on the
    # GEMVs at 3-8 rows, the tensor-core GEMV at 256 threads): every
    # test_cuda_* binary, then the 1-8-row bench rows and a few target rows
    # of the same build (the earlier calls' rows of this stop, same card
    # kind, are the before).
    prebuilt_stage final41
    DEADLINE=${DEADLINE:-560}
    bash scripts/run_cuda_tests.sh $B 2>&1 | tee "$OUT/cuda_tests.log" | grep -vE "^ok " | tail -30
    echo "== tests done ($(el))"
    wait $MODEL_PID
    bench_header
    for b in 1 2 3 4 5 6 8; do
        bench_row b${b} 512 $b --kv f16
    done
    bench_row b8_none 512 8 --kv f16 --sampling none
    bench_row b8_8192 8192 8 --kv f16
    bench_row b4_q8h 512 4 --kv f16 --quantize int8 --quantize-head
    bench_row b8_q4 512 8 --kv f16 --quantize q4
    bench_row b64_1024 1024 64 --kv f16
    ;;
norm41)
    # stop 41: the RMSNorm kernel of 2..1,023 rows with the norm weight read
    # before its PDL wait and the row kept in registers (one memory latency
    # after the wait instead of three; the same bits).  Its test, the e2e /
    # greedy tests, bench rows beside the base tree's (the build before).
    prebuilt_stage norm41
    DEADLINE=${DEADLINE:-560}
    base_tree || { echo "norm41: needs the base tree (pack_prebuilt.sh BASE=DIR)"; exit 1; }
    LOGSUFFIX=_norm gtest test_cuda_kernels DSQ_TEST_FILTER=test_rmsnorm
    grep -E "rmsnorm T=(2|1031) E=(1536|3584|5000) " "$OUT/test_cuda_kernels_norm.log" | head -6
    gtest test_cuda_e2e
    gtest test_cuda_step_greedy
    wait $MODEL_PID
    bench_header
    for rep in 1 2; do
        for b in 2 4 8; do
            base_row base_b${b}_r$rep 512 $b --kv f16
            bench_row new_b${b}_r$rep 512 $b --kv f16
        done
        base_row base_b1_r$rep 512 1 --kv f16
        bench_row new_b1_r$rep 512 1 --kv f16
    done
    base_row base_b64 1024 64 --kv f16
    bench_row new_b64 1024 64 --kv f16
    ;;
start42)
    # stop 42's first call (tree 4a055b1): every test_cuda_* binary on main
    # plus two experiments, both off by default then (gemv_mma.cu's
    # DSQ_CUDA_GEMV_MMA_UNROLL=8 / _GRID=resident, gemv.cu's one-round
    # instance, tag oneround-stop42, tested and timed explicitly in
    # test_cuda_kernels), the mma knobs' test and 1-8-row table each way,
    # then where a sampled batch-1 step goes (PDL on, timeline).  On later
    # trees the unroll is the default and the other knobs do nothing.
    prebuilt_stage start42
    DEADLINE=${DEADLINE:-560}
    bash scripts/run_cuda_tests.sh $B 2>&1 | tee "$OUT/cuda_tests.log" | grep -vE "^ok " | tail -30
    grep -E "dsq_cu_linear K=" $B/tests/test_cuda_kernels.log
    grep -cE "gemv-u8 .*ok|gemv-u8" $B/tests/test_cuda_kernels.log
    grep -E "^  (shape|gate/up|lm_head|qkv|o |down) " $B/tests/test_cuda_kernels.log | grep -E "shape| (1|2|4|8) " | head -24
    cp $B/tests/test_cuda_kernels.log "$OUT/test_cuda_kernels_full.log"
    echo "== tests done ($(el))"
    for cfg in "DSQ_CUDA_GEMV_MMA_UNROLL=8" "DSQ_CUDA_GEMV_MMA_GRID=resident" \
               "DSQ_CUDA_GEMV_MMA_UNROLL=8 DSQ_CUDA_GEMV_MMA_GRID=resident"; do
        tag=$(echo "$cfg" | tr -c 'a-zA-Z0-9\n' '_')
        LOGSUFFIX=_$tag gtest test_cuda_kernels "DSQ_TEST_FILTER=test_gemv_mma" $cfg
        LOGSUFFIX=_t_$tag gtest test_cuda_kernels DSQ_TEST_FILTER=test_small_rows_timing $cfg
        grep -E "^  (gate/up|lm_head|qkv|o ) .* (4|8) " "$OUT/test_cuda_kernels_t_$tag.log"
    done
    wait $MODEL_PID
    export PYTHONUNBUFFERED=1 DSQWEN_LIBRARY=$B/libdsqwen.so
    timeout 90 python3 tests/bench/kernel_profile.py --model $M --json "$OUT/b1_s.json" --batch 1 --context 512 \
        --sample >"$OUT/b1_s.log" 2>&1
    echo "== profile b1 sampled rc=$? ($(el))"
    head -14 "$OUT/b1_s.log"
    sed -n '/^timeline/,$p' "$OUT/b1_s.log" | head -30
    ;;
bench42)
    # stop 42's second call: bench rows of the tensor-core GEMV's 8 chunks
    # per warp in flight (DSQ_CUDA_GEMV_MMA_UNROLL=8; start42's table: gate/up
    # at 8 rows 22.4 vs 24.4 us, the head 161.4 vs 164.9) beside the
    # default, interleaved, at the batch sizes that run it (4-8 rows)
    prebuilt_stage bench42
    DEADLINE=${DEADLINE:-560}
    LOGSUFFIX=_u8 gtest test_cuda_e2e DSQ_CUDA_GEMV_MMA_UNROLL=8
    bench_start
    for rep in 1 2 3; do
        for b in 4 8; do
            bench_row b${b}_r$rep 512 $b --kv f16
            DSQ_CUDA_GEMV_MMA_UNROLL=8 bench_row u8_b${b}_r$rep 512 $b --kv f16
        done
    done
    bench_row b8_8192 8192 8 --kv f16
    DSQ_CUDA_GEMV_MMA_UNROLL=8 bench_row u8_b8_8192 8192 8 --kv f16
    bench_row b8_none 512 8 --kv f16 --sampling none
    DSQ_CUDA_GEMV_MMA_UNROLL=8 bench_row u8_b8_none 512 8 --kv f16 --sampling none
    ;;
final42)
    # stop 42's last call: every test_cuda_* binary on the final tree (the
    # tensor-core GEMV's plain launches at 8 chunks per warp by default),
    # then bench rows beside the previous default (DSQ_CUDA_GEMV_MMA_UNROLL=4)
    prebuilt_stage final42
    DEADLINE=${DEADLINE:-560}
    bash scripts/run_cuda_tests.sh $B 2>&1 | tee "$OUT/cuda_tests.log" | grep -vE "^ok " | tail -30
    echo "== tests done ($(el))"
    LOGSUFFIX=_u4 gtest test_cuda_kernels "DSQ_TEST_FILTER=test_gemv_mma" DSQ_CUDA_GEMV_MMA_UNROLL=4
    bench_start
    for rep in 1 2; do
        for b in 4 8; do
            bench_row b${b}_r$rep 512 $b --kv f16
            DSQ_CUDA_GEMV_MMA_UNROLL=4 bench_row u4_b${b}_r$rep 512 $b --kv f16
        done
    done
    # down at 1-2 rows on 128 x 4 / 128 x 8 blocks (DSQ_CUDA_GEMV_LONG_R, a
    # knob of tree c4df826 only: measured no faster, taken out after)
    for rep in 1 2; do
        bench_row b1_r$rep 512 1 --kv f16
        DSQ_CUDA_GEMV_LONG_R=4 bench_row lr4_b1_r$rep 512 1 --kv f16
        DSQ_CUDA_GEMV_LONG_R=8 bench_row lr8_b1_r$rep 512 1 --kv f16
    done
    DSQ_CUDA_GEMV_LONG_R=4 bench_row lr4_b2 512 2 --kv f16
    bench_row b1_none 512 1 --kv f16 --sampling none
    bench_row b2 512 2 --kv f16
    bench_row b8_8192 8192 8 --kv f16
    bench_row b64_1024 1024 64 --kv f16
    # decode attention at one split per sequence (the direct output, no
    # merge launch) where the plan gives 2-3 (batch 64: 128 kv-head units)
    DSQ_CUDA_DECODE_SPLITS_MAX=1 bench_row s1_b64_1024 1024 64 --kv f16
    bench_row b64_4096 4096 64 --kv f16
    DSQ_CUDA_DECODE_SPLITS_MAX=1 bench_row s1_b64_4096 4096 64 --kv f16
    bench_row b64_4096_i8 4096 64 --kv int8
    DSQ_CUDA_DECODE_SPLITS_MAX=1 bench_row s1_b64_4096_i8 4096 64 --kv int8
    DSQ_CUDA_DECODE_SPLITS_MAX=2 bench_row s2_b64_4096_i8 4096 64 --kv int8
    bench_row b64_1024_r2 1024 64 --kv f16
    DSQ_CUDA_DECODE_SPLITS_MAX=1 bench_row s1_b64_1024_r2 1024 64 --kv f16
    ;;
mmanorm42)
    # stop 42's branch mma-norm: the RMSNorm before qkv folded into the
    # tensor-core GEMV at 4-8 rows (DSQ_CUDA_MMA_NORM=256, off by default;
    # its norm now a warp per row): the kernel and dispatch tests, the e2e
    # tests with it on, then bench rows beside the default, interleaved
    prebuilt_stage mmanorm42
    DEADLINE=${DEADLINE:-300}
    LOGSUFFIX=_mma gtest test_cuda_kernels DSQ_TEST_FILTER=test_gemv_mma
    LOGSUFFIX=_disp gtest test_cuda_kernels DSQ_TEST_FILTER=test_linear_dispatch
    grep -hE "dsq_cu_linear|FAIL|worst" "$OUT"/test_cuda_kernels_mma.log "$OUT"/test_cuda_kernels_disp.log | head -12
    LOGSUFFIX=_mn gtest test_cuda_e2e DSQ_CUDA_MMA_NORM=256
    LOGSUFFIX=_mn gtest test_cuda_step_greedy DSQ_CUDA_MMA_NORM=256
    bench_start
    for rep in $(seq 1 ${REPS:-2}); do
        for b in 4 8; do
            bench_row b${b}_r$rep 512 $b --kv f16
            DSQ_CUDA_MMA_NORM=256 bench_row mn_b${b}_r$rep 512 $b --kv f16
        done
    done
    ;;
s47)
    # stop 47 (no GPU lent; written for the next call): decode attention's
    # lean cp.async loader (DSQ_CUDA_DECODE_LEAN=1: addressed once per tile,
    # ~123 loader instructions a tile in SASS against ~450) and bulk copies, bit for
    # bit against cp.async, then bench rows each way with the occupancy
    # beside them.  Batch 64 plans
    # 2 splits = 256 blocks, under 2 per SM; DSQ_CUDA_DECODE_BLOCKS_PER_SM=3
    # plans 3 (384 blocks) and DSQ_CUDA_DECODE_STAGES=2 lets an F16 SM hold
    # 3 of them (stop 20 ran the 2-stage ring at 2 splits only).  Then the
    # isolated split table with the 2-stage ring, the bulk tests, e2e
    prebuilt_stage s47
    DEADLINE=${DEADLINE:-300}
    DSQ_TEST_FILTER='test_decode_batch' GTEST_TIMEOUT=90 gtest test_cuda_attention
    for w in bulk-copy "lean cp.async"; do
        echo "   $w checks: $(grep -c "$w loader vs cp.async" "$OUT/test_cuda_attention.log")," \
             "wrong: $(grep "$w loader vs cp.async" "$OUT/test_cuda_attention.log" | grep -vc ": 0 bf16 values differ; [a-z]* instance launched")"
    done
    grep -m1 "not available" "$OUT/test_cuda_attention.log"
    # the loaders' other paths: paged blocks of 32-128, D = 64, a static capacity of 32
    LOGSUFFIX=_shapes DSQ_TEST_FILTER=test_other_shapes GTEST_TIMEOUT=90 gtest test_cuda_attention
    echo "   other shapes: $(grep -c "loader vs cp.async" "$OUT/test_cuda_attention_shapes.log") checks," \
         "wrong: $(grep "loader vs cp.async" "$OUT/test_cuda_attention_shapes.log" | grep -vc ": 0 bf16 values differ; [a-z]* instance launched")"
    bench_start
    for ctx in 1024 4096; do
        bench_row b64_${ctx} $ctx 64 --kv f16
        DSQ_CUDA_DECODE_LEAN=1 bench_row lean_b64_${ctx} $ctx 64 --kv f16
        DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_${ctx} $ctx 64 --kv f16
        DSQ_CUDA_DECODE_STAGES=2 DSQ_CUDA_DECODE_BLOCKS_PER_SM=3 bench_row occ3_b64_${ctx} $ctx 64 --kv f16
        DSQ_CUDA_DECODE_STAGES=2 DSQ_CUDA_DECODE_BLOCKS_PER_SM=3 DSQ_CUDA_DECODE_LEAN=1 \
            bench_row occ3lean_b64_${ctx} $ctx 64 --kv f16
        DSQ_CUDA_DECODE_STAGES=2 DSQ_CUDA_DECODE_BLOCKS_PER_SM=3 DSQ_CUDA_DECODE_BULK=1 \
            bench_row occ3bulk_b64_${ctx} $ctx 64 --kv f16
    done
    bench_row b64_4096_i8 4096 64 --kv int8
    DSQ_CUDA_DECODE_LEAN=1 bench_row lean_b64_4096_i8 4096 64 --kv int8
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_4096_i8 4096 64 --kv int8
    bench_row b1 512 1 --kv f16
    DSQ_CUDA_DECODE_LEAN=1 bench_row lean_b1 512 1 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b1 512 1 --kv f16
    # isolated launches, every split count, the 2-stage ring (3 blocks per
    # SM for F16) beside the default ring
    LOGSUFFIX=_time DSQ_TEST_FILTER=test_timing GTEST_TIMEOUT=120 gtest test_cuda_attention
    LOGSUFFIX=_time_s2 DSQ_CUDA_DECODE_STAGES=2 DSQ_TEST_FILTER=test_timing GTEST_TIMEOUT=120 gtest test_cuda_attention
    grep -hE "batch 64 splits" "$OUT/test_cuda_attention_time.log" "$OUT/test_cuda_attention_time_s2.log" | head -40
    LOGSUFFIX=_lean gtest test_cuda_e2e DSQ_CUDA_DECODE_LEAN=1
    LOGSUFFIX=_bulk gtest test_cuda_e2e DSQ_CUDA_DECODE_BULK=1
    LOGSUFFIX=_occ3 gtest test_cuda_e2e DSQ_CUDA_DECODE_STAGES=2 DSQ_CUDA_DECODE_BLOCKS_PER_SM=3
    # one split per sequence (128 blocks, no merge launch) with the lean loader
    DSQ_CUDA_DECODE_SPLITS_MAX=1 bench_row split1_b64_1024 1024 64 --kv f16
    DSQ_CUDA_DECODE_SPLITS_MAX=1 DSQ_CUDA_DECODE_LEAN=1 bench_row lean_split1_b64_1024 1024 64 --kv f16
    for rep in 2; do
        bench_row b64_1024_r$rep 1024 64 --kv f16
        DSQ_CUDA_DECODE_LEAN=1 bench_row lean_b64_1024_r$rep 1024 64 --kv f16
        DSQ_CUDA_DECODE_STAGES=2 DSQ_CUDA_DECODE_BLOCKS_PER_SM=3 bench_row occ3_b64_1024_r$rep 1024 64 --kv f16
        DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_1024_r$rep 1024 64 --kv f16
    done
    bench_row b256_1k_i8 1024 256 --kv int8
    DSQ_CUDA_DECODE_LEAN=1 bench_row lean_b256_1k_i8 1024 256 --kv int8
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b256_1k_i8 1024 256 --kv int8
    LOGSUFFIX=_nf DSQ_TEST_FILTER=test_nonfinite_kv gtest test_cuda_attention
    LOGSUFFIX=_lean gtest test_cuda_step_greedy DSQ_CUDA_DECODE_LEAN=1
    if command -v compute-sanitizer >/dev/null && [ $(( $(date +%s) - T0 )) -lt $(( DEADLINE + 60 )) ]; then
        DSQ_CUDA_DECODE_LEAN=1 DSQ_ATTN_QUICK=1 DSQ_TEST_FILTER=test_decode_rope timeout 100 compute-sanitizer \
            --tool memcheck "$B/tests/test_cuda_attention" >"$OUT/memcheck_lean.log" 2>&1
        echo "== memcheck lean rc=$? ($(el)) $(grep -E "ERROR SUMMARY" "$OUT/memcheck_lean.log" | tr '\n' ' ')"
    fi
    ;;
s46b)
    # stop 46, a short call: s46a's deciding parts first (bulk-copy decode
    # loader: one test group bit for bit, the batch-64 / INT8 / batch-1
    # pairs, e2e), then the rest while the deadline allows
    prebuilt_stage s46b
    DEADLINE=${DEADLINE:-240}
    DSQ_TEST_FILTER='test_decode_batch' GTEST_TIMEOUT=90 gtest test_cuda_attention
    echo "   bulk checks: $(grep -c "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention.log")," \
         "wrong: $(grep "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention.log" | grep -vc ": 0 bf16 values differ; bulk instance")" \
         "$(grep -m1 "not available" "$OUT/test_cuda_attention.log")"
    bench_start
    bench_row b64_1k 1024 64 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_1k 1024 64 --kv f16
    bench_row b64_4k_i8 4096 64 --kv int8
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_4k_i8 4096 64 --kv int8
    bench_row b64_4k 4096 64 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_4k 4096 64 --kv f16
    bench_row b1 512 1 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b1 512 1 --kv f16
    LOGSUFFIX=_bulk gtest test_cuda_e2e DSQ_CUDA_DECODE_BULK=1
    LOGSUFFIX=_rope DSQ_TEST_FILTER='test_decode_ro*' GTEST_TIMEOUT=90 gtest test_cuda_attention
    echo "   rope bulk checks: $(grep -c "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention_rope.log")," \
         "wrong: $(grep "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention_rope.log" | grep -vc ": 0 bf16 values differ; bulk instance")"
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_1k_r2 1024 64 --kv f16
    bench_row b64_1k_r2 1024 64 --kv f16
    LOGSUFFIX=_nf DSQ_TEST_FILTER=test_nonfinite_kv gtest test_cuda_attention
    LOGSUFFIX=_bulk gtest test_cuda_step_greedy DSQ_CUDA_DECODE_BULK=1
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b256_1k_i8 1024 256 --kv int8
    bench_row b256_1k_i8 1024 256 --kv int8
    ;;
s46a)
    # stop 46, first call: the decode ring filled by bulk copies (F16 and INT8)
    # (DSQ_CUDA_DECODE_BULK=1, off by default): the attention tests (bit
    # for bit against cp.async, back to back, graph replays; non-finite
    # K/V), e2e with it on, bench pairs; ncu of a batch-64 decode launch
    # each way (full set, per-instruction stall samples); stop 45's owed
    # rows (4-bit no logits); memcheck / racecheck of the bulk path
    prebuilt_stage s46a
    DEADLINE=${DEADLINE:-420}
    DSQ_TEST_FILTER='test_decode_*' GTEST_TIMEOUT=150 gtest test_cuda_attention
    echo "   bulk checks: $(grep -c "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention.log")," \
         "wrong: $(grep "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention.log" | grep -vc ": 0 bf16 values differ; bulk instance")" \
         "$(grep -m1 "not available" "$OUT/test_cuda_attention.log")"
    LOGSUFFIX=_nf DSQ_TEST_FILTER=test_nonfinite_kv gtest test_cuda_attention
    # the 2-stage rings (bulk_s2 row below) against cp.async's 2-stage ring
    LOGSUFFIX=_s2 DSQ_CUDA_DECODE_STAGES=2 DSQ_TEST_FILTER='test_decode_ro*' GTEST_TIMEOUT=100 gtest test_cuda_attention
    echo "   2-stage bulk checks: $(grep -c "bulk instance launched" "$OUT/test_cuda_attention_s2.log")," \
         "wrong: $(grep "bulk-copy loader vs cp.async" "$OUT/test_cuda_attention_s2.log" | grep -vc ": 0 bf16 values differ; bulk instance")"
    LOGSUFFIX=_bulk gtest test_cuda_e2e DSQ_CUDA_DECODE_BULK=1
    LOGSUFFIX=_bulk gtest test_cuda_step_greedy DSQ_CUDA_DECODE_BULK=1
    bench_start
    for rep in 1 2; do
        bench_row b64_1k_r$rep 1024 64 --kv f16
        DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_1k_r$rep 1024 64 --kv f16
    done
    bench_row b64_1k_none 1024 64 --kv f16 --sampling none
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_1k_none 1024 64 --kv f16 --sampling none
    # bulk copies leave the F16 kernel 150 registers: the 2-stage ring at
    # 3 blocks per SM (the split plan still assumes 2)
    DSQ_CUDA_DECODE_STAGES=2 DSQ_CUDA_DECODE_BULK=1 bench_row bulk_s2_b64_1k 1024 64 --kv f16
    bench_row b64_4k 4096 64 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_4k 4096 64 --kv f16
    bench_row b64_4k_i8 4096 64 --kv int8
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b64_4k_i8 4096 64 --kv int8
    bench_row b256_1k_i8 1024 256 --kv int8
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b256_1k_i8 1024 256 --kv int8
    for rep in 1 2; do
        bench_row b1_r$rep 512 1 --kv f16
        DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b1_r$rep 512 1 --kv f16
    done
    bench_row b1_8k 8192 1 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b1_8k 8192 1 --kv f16
    bench_row b8 512 8 --kv f16
    DSQ_CUDA_DECODE_BULK=1 bench_row bulk_b8 512 8 --kv f16
    if command -v ncu >/dev/null && [ $(( $(date +%s) - T0 )) -lt $DEADLINE ]; then
        for v in 0 1; do
            DSQ_CUDA_DECODE_BULK=$v timeout 100 ncu --clock-control none -k regex:decode_kernel --launch-skip 90 --launch-count 1 \
                --set full --import-source no -o "$OUT/dec64_bulk$v" \
                "$B/examples/dsqwen" bench --model $M --prompt-len 1024 --max-tokens 8 --batch 64 --kv f16 \
                >"$OUT/ncu_dec64_bulk$v.log" 2>&1
            echo "== ncu dec64 bulk=$v rc=$? ($(el))"
            ncu -i "$OUT/dec64_bulk$v.ncu-rep" --page details --print-details all >"$OUT/ncu_dec64_bulk${v}_details.txt" 2>&1
            ncu -i "$OUT/dec64_bulk$v.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_dec64_bulk${v}_sass.csv" 2>&1
            grep -E "^  [a-z_]+.*decode_kernel|Duration|DRAM Throughput|Executed Instructions  |Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy" \
                "$OUT/ncu_dec64_bulk${v}_details.txt" | head -12
        done
    fi
    DSQ_TEST_FILTER='test_q4_mma_linear' GTEST_TIMEOUT=100 gtest test_cuda_quant
    grep -hE "SKIP|FAIL|ERROR|identical|worst" "$OUT/test_cuda_quant.log" | head -6
    bench_row q4_none 512 1 --kv f16 --quantize q4 --sampling none
    bench_row q4b8_none 512 8 --kv f16 --quantize q4 --sampling none
    DEADLINE=$(( DEADLINE + 100 ))
    if command -v compute-sanitizer >/dev/null && [ $(( $(date +%s) - T0 )) -lt $DEADLINE ]; then
        for tool in memcheck racecheck; do
            DSQ_CUDA_DECODE_BULK=1 DSQ_ATTN_QUICK=1 DSQ_TEST_FILTER=test_decode_rope timeout 100 compute-sanitizer --tool $tool \
                "$B/tests/test_cuda_attention" >"$OUT/${tool}_bulk.log" 2>&1
            echo "== $tool bulk rc=$? ($(el)) $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/${tool}_bulk.log" | tr '\n' ' ')"
        done
    fi
    ;;
s45)
    # stop 45: the decode merge in the decode kernel's blocks
    # (DSQ_CUDA_DECODE_MERGE_FUSE=32, off by default): the attention tests
    # (bit for bit against the merge kernel, counters back at zero), e2e
    # with it on, bench pairs; stop 44's unrun quantized pieces (the norm
    # fold DSQ_CUDA_QMMA_NORM, 2-warp gate/up): their tests, rows; then
    # memcheck and the slower tests while the deadline allows
    prebuilt_stage s45
    DEADLINE=${DEADLINE:-420}
    DSQ_TEST_FILTER='test_decode_*' GTEST_TIMEOUT=150 gtest test_cuda_attention
    echo "   fused-merge checks: $(grep -c "merge in the decode blocks" "$OUT/test_cuda_attention.log")," \
         "not identical: $(grep "merge in the decode blocks" "$OUT/test_cuda_attention.log" | grep -vcE " 0 bf16 values differ, 0 counters left non-zero; (counted path|merge kernel) taken")"
    LOGSUFFIX=_fm gtest test_cuda_e2e DSQ_CUDA_DECODE_MERGE_FUSE=32
    DSQ_TEST_FILTER='test_q4_mma_norm' GTEST_TIMEOUT=100 gtest test_cuda_quant
    grep -hE "SKIP|FAIL|ERROR|worst" "$OUT/test_cuda_quant.log" | head -6
    LOGSUFFIX=_qn gtest test_cuda_quant_e2e DSQ_CUDA_QMMA_NORM=256
    bench_start
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row b1_r$rep 512 1 --kv f16
        DSQ_CUDA_DECODE_MERGE_FUSE=32 bench_row b1_fm_r$rep 512 1 --kv f16
        bench_row q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QMMA_NORM=256 bench_row q4_qn_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QMMA_WIDE_WARPS=2 bench_row q4_w2_r$rep 512 1 --kv f16 --quantize q4
    done
    bench_row b8 512 8 --kv f16
    DSQ_CUDA_DECODE_MERGE_FUSE=32 bench_row b8_fm 512 8 --kv f16
    bench_row b64_1k 1024 64 --kv f16
    DSQ_CUDA_DECODE_MERGE_FUSE=32 bench_row b64_1k_fm 1024 64 --kv f16
    bench_row q4b8 512 8 --kv f16 --quantize q4
    DSQ_CUDA_QMMA_NORM=256 bench_row q4b8_qn 512 8 --kv f16 --quantize q4
    DSQ_CUDA_QMMA_WIDE_WARPS=2 bench_row q4b8_w2 512 8 --kv f16 --quantize q4
    bench_row q8_r1 512 1 --kv f16 --quantize int8
    DSQ_CUDA_QMMA_NORM=256 bench_row q8_qn 512 1 --kv f16 --quantize int8
    DSQ_CUDA_DECODE_MERGE_FUSE=32 bench_row q4_fm 512 1 --kv f16 --quantize q4
    bench_row b1_none 512 1 --kv f16 --sampling none
    DSQ_CUDA_DECODE_MERGE_FUSE=32 bench_row b1_none_fm 512 1 --kv f16 --sampling none
    DEADLINE=$(( DEADLINE + 100 ))
    if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null && [ $(( $(date +%s) - T0 )) -lt $DEADLINE ]; then
        DSQ_ATTN_QUICK=1 DSQ_TEST_FILTER=test_decode_rope timeout 100 compute-sanitizer --tool memcheck \
            "$B/tests/test_cuda_attention" >"$OUT/memcheck_fm.log" 2>&1
        echo "== memcheck fm rc=$? ($(el)) $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_fm.log" | tr '\n' ' ')"
        DSQ_ATTN_QUICK=1 DSQ_TEST_FILTER=test_decode_rope timeout 100 compute-sanitizer --tool racecheck \
            "$B/tests/test_cuda_attention" >"$OUT/racecheck_fm.log" 2>&1
        echo "== racecheck fm rc=$? ($(el)) $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/racecheck_fm.log" | tr '\n' ' ')"
    fi
    if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null && [ $(( $(date +%s) - T0 )) -lt $DEADLINE ]; then
        DSQ_TEST_FILTER=test_q4_mma_norm timeout 100 compute-sanitizer --tool memcheck "$B/tests/test_cuda_quant" \
            >"$OUT/memcheck_qn.log" 2>&1
        echo "== memcheck qn rc=$? ($(el)) $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_qn.log" | tr '\n' ' ')"
    fi
    LOGSUFFIX=_fm gtest test_cuda_step_greedy DSQ_CUDA_DECODE_MERGE_FUSE=32
    LOGSUFFIX=_qn gtest test_cuda_quant_decode DSQ_CUDA_QMMA_NORM=256
    LOGSUFFIX=_nf DSQ_TEST_FILTER=test_nonfinite_kv gtest test_cuda_attention
    # why batch 64's decode attention runs at ~1.95 TB/s (stop 43's
    # timeline): ncu of one decode launch in a steady step (28 a step)
    if command -v ncu >/dev/null && [ $(( $(date +%s) - T0 )) -lt $DEADLINE ]; then
        timeout 120 ncu --clock-control none -k regex:decode_kernel --launch-skip 90 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
            --section MemoryWorkloadAnalysis --section SchedulerStats \
            "$B/examples/dsqwen" bench --model $M --prompt-len 1024 --max-tokens 8 --batch 64 --kv f16 \
            >"$OUT/ncu_dec64.log" 2>&1
        echo "== ncu dec64 rc=$? ($(el))"
        grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Grid Size|Block Size|Dynamic Shared|[Ss]tall" \
            "$OUT/ncu_dec64.log" | head -40
    fi
    ;;
final44)
    # stop 44's final defaults: down on the quantized tensor-core GEMV (4-bit
    # from 1 row, INT8 from 2; 16-warp blocks), the kernel's register bound
    # and shared memory by launch width; 4-bit gate/up on 2-warp blocks
    # (DSQ_CUDA_QMMA_WIDE_WARPS=2, table-only so far): every quantized test,
    # the product table, rows beside the knobs; the RMSNorm folded into it
    # for qkv (DSQ_CUDA_QMMA_NORM=256, off by default): tests, rows
    prebuilt_stage final44
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=240 gtest test_cuda_quant
    grep -hE "gemv mma q|x8960 T=[128] rows 8|\+norm 2048x1536 T=[18] qmma_norm 256|SKIP|FAIL|ERROR" \
        "$OUT/test_cuda_quant.log" | head -16
    sed -n '/quantized products, us per call/,$p' "$OUT/test_cuda_quant.log" | grep -E "fmt| [18] " | head -20
    gtest test_cuda_quant_e2e
    gtest test_cuda_quant_decode
    LOGSUFFIX=_qn gtest test_cuda_quant_e2e DSQ_CUDA_QMMA_NORM=256
    LOGSUFFIX=_qn gtest test_cuda_quant_decode DSQ_CUDA_QMMA_NORM=256
    if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
        DSQ_TEST_FILTER=test_q4_mma_norm timeout 200 compute-sanitizer --tool memcheck "$B/tests/test_cuda_quant" \
            >"$OUT/memcheck_qn.log" 2>&1
        echo "== memcheck rc=$? ($(el)) $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_qn.log" | tr '\n' ' ')"
    fi
    bench_start
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QMMA_NORM=256 bench_row q4_qn_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QMMA_WIDE_WARPS=2 bench_row q4_w2_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_NORM_FUSE=0 bench_row q4_nofuse_r$rep 512 1 --kv f16 --quantize q4
    done
    DSQ_CUDA_QMMA_NORM=256 bench_row q4b4_qn 512 4 --kv f16 --quantize q4
    DSQ_CUDA_QMMA_NORM=256 bench_row q4b8_qn 512 8 --kv f16 --quantize q4
    for rep in $(seq 1 ${REPS:-2}); do
        DSQ_CUDA_QMMA_NORM=256 bench_row q8_qn_r$rep 512 1 --kv f16 --quantize int8
    done
    DSQ_CUDA_QMMA_NORM=256 bench_row q8b8_qn 512 8 --kv f16 --quantize int8
    bench_row q4_none 512 1 --kv f16 --quantize q4 --sampling none
    bench_row q4b2 512 2 --kv f16 --quantize q4
    bench_row q4b4 512 4 --kv f16 --quantize q4
    bench_row q4b8 512 8 --kv f16 --quantize q4
    DSQ_CUDA_QMMA_WIDE_WARPS=2 bench_row q4b8_w2 512 8 --kv f16 --quantize q4
    bench_row q4b8_none 512 8 --kv f16 --quantize q4 --sampling none
    bench_row q4h 512 1 --kv f16 --quantize q4 --quantize-head
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q8_r$rep 512 1 --kv f16 --quantize int8
        bench_row q8b2_r$rep 512 2 --kv f16 --quantize int8
        DSQ_CUDA_Q8_MMA_LONG=0 bench_row q8b2_nolong_r$rep 512 2 --kv f16 --quantize int8
    done
    bench_row q8_none 512 1 --kv f16 --quantize int8 --sampling none
    bench_row q8b8 512 8 --kv f16 --quantize int8
    bench_row q8b8_none 512 8 --kv f16 --quantize int8 --sampling none
    bench_row q8h 512 1 --kv f16 --quantize int8 --quantize-head
    bench_row b1 512 1 --kv f16
    ;;
long44)
    # stop 44, second step: down (K = 8,960) on the quantized tensor-core
    # GEMV with 16-warp blocks and 5 units in flight per warp
    # (DSQ_CUDA_QMMA_LONG=m then, off by default; since 4-bit from 1 row
    # and INT8 from 2 by default: DSQ_CUDA_Q4_MMA_LONG / _Q8_MMA_LONG): its tests, the product table
    # with a 16-warp column, rows beside the default; the INT8 head on the
    # new default (DSQ_CUDA_Q8_MMA covers it) beside Q8_MMA=0; a sampled
    # 4-bit batch-1 timeline (PROF=0 skips it)
    prebuilt_stage long44
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=200 LOGSUFFIX=_mq gtest test_cuda_quant DSQ_TEST_FILTER=test_q4_mma*
    grep -hE "gemv mma q|x8960 T=[18] rows|FAIL|ERROR" "$OUT/test_cuda_quant_mq.log" | head -10
    GTEST_TIMEOUT=200 LOGSUFFIX=_mqt gtest test_cuda_quant DSQ_TEST_FILTER=test_timing_q4_mma
    sed -n '/quantized products, us per call/,$p' "$OUT/test_cuda_quant_mqt.log" | grep -E "fmt|down|gate" | head -20
    LOGSUFFIX=_long gtest test_cuda_quant_e2e DSQ_CUDA_Q4_MMA_LONG=1 DSQ_CUDA_Q8_MMA_LONG=1
    bench_start
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA_LONG=1 bench_row q4_long_r$rep 512 1 --kv f16 --quantize q4
        bench_row q8_r$rep 512 1 --kv f16 --quantize int8
        DSQ_CUDA_Q8_MMA_LONG=1 bench_row q8_long_r$rep 512 1 --kv f16 --quantize int8
    done
    bench_row q4b8 512 8 --kv f16 --quantize q4
    DSQ_CUDA_Q4_MMA_LONG=1 bench_row q4b8_long 512 8 --kv f16 --quantize q4
    bench_row q8b8 512 8 --kv f16 --quantize int8
    DSQ_CUDA_Q8_MMA_LONG=1 bench_row q8b8_long 512 8 --kv f16 --quantize int8
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q8h_r$rep 512 1 --kv f16 --quantize int8 --quantize-head
        DSQ_CUDA_Q8_MMA=0 bench_row q8h_old_r$rep 512 1 --kv f16 --quantize int8 --quantize-head
    done
    bench_row q4h 512 1 --kv f16 --quantize q4 --quantize-head
    bench_row q4h_none 512 1 --kv f16 --quantize q4 --quantize-head --sampling none
    if [ "${PROF:-1}" = 1 ]; then
        export PYTHONUNBUFFERED=1 DSQWEN_LIBRARY=$B/libdsqwen.so
        timeout 90 python3 tests/bench/kernel_profile.py --model $M --json "$OUT/q4_b1_s.json" --batch 1 \
            --context 512 --quantize q4 --sample >"$OUT/q4_b1_s.log" 2>&1
        echo "== profile q4 b1 rc=$? ($(el))"
        sed -n '/^timeline/,$p' "$OUT/q4_b1_s.log" | head -24
    fi
    ;;
qmma44)
    # stop 44: the quantized tensor-core GEMV (gemv_mma_quant.cu) as the
    # default for Q4 / Q8 products of 1-8 rows (K <= 4,096): every quantized
    # GPU test on the default build, then rows beside DSQ_CUDA_Q4_MMA=0 /
    # DSQ_CUDA_Q8_MMA=0 (stop 43's paths).  As run at 9d79900 the default
    # also had 4-bit down there from 4 rows: the "nolong" rows
    # (then DSQ_CUDA_Q4_MMA_LONG=0) are today's default, the plain q4b4 /
    # q4b8 rows now need DSQ_CUDA_Q4_MMA_LONG=4 with 8-warp blocks, which
    # no longer exist: the rows compare today's default with DSQ_CUDA_Q4_MMA_LONG=0
    prebuilt_stage qmma44
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=240 gtest test_cuda_quant
    grep -hE "dsq_cu_linear q. [0-9]+x8960 T=[1248] rows 8|worst|SKIP|FAIL|ERROR" "$OUT/test_cuda_quant.log" | head -16
    gtest test_cuda_quant_e2e
    gtest test_cuda_quant_decode
    if [ "${QUICK:-0}" != 1 ]; then
        gtest test_cuda_e2e
        gtest test_cuda_step_greedy
    fi
    bench_start
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA=0 bench_row q4_old_r$rep 512 1 --kv f16 --quantize q4
    done
    bench_row q4_none 512 1 --kv f16 --quantize q4 --sampling none
    bench_row q4b2 512 2 --kv f16 --quantize q4
    DSQ_CUDA_Q4_MMA=0 bench_row q4b2_old 512 2 --kv f16 --quantize q4
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q4b4_r$rep 512 4 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA_LONG=0 bench_row q4b4_nolong_r$rep 512 4 --kv f16 --quantize q4
        bench_row q4b8_r$rep 512 8 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA_LONG=0 bench_row q4b8_nolong_r$rep 512 8 --kv f16 --quantize q4
    done
    DSQ_CUDA_Q4_MMA=0 bench_row q4b4_old 512 4 --kv f16 --quantize q4
    DSQ_CUDA_Q4_MMA=0 bench_row q4b8_old 512 8 --kv f16 --quantize q4
    bench_row q4b8_none 512 8 --kv f16 --quantize q4 --sampling none
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q8_r$rep 512 1 --kv f16 --quantize int8
        DSQ_CUDA_Q8_MMA=0 bench_row q8_old_r$rep 512 1 --kv f16 --quantize int8
    done
    bench_row q8_none 512 1 --kv f16 --quantize int8 --sampling none
    bench_row q8b8 512 8 --kv f16 --quantize int8
    DSQ_CUDA_Q8_MMA=0 bench_row q8b8_old 512 8 --kv f16 --quantize int8
    bench_row q8b8_none 512 8 --kv f16 --quantize int8 --sampling none
    bench_row b1 512 1 --kv f16
    bench_row b8 512 8 --kv f16
    ;;
split43)
    # stop 43: (1) the mma-norm fold, now on by default: its tests on the
    # default build, batch 4 / 8 beside DSQ_CUDA_MMA_NORM=0; (2) the new
    # quantized tensor-core GEMV (gemv_mma_quant.cu, DSQ_CUDA_Q4_MMA /
    # DSQ_CUDA_Q8_MMA=n, off by default): its tests, timing table, the
    # quantized e2e test with it on, and 4-bit / INT8 rows beside the
    # default; (3) NCU=1: ncu of the 4-bit gate/up kernels and the
    # batch-64 decode attention kernel
    prebuilt_stage split43
    DEADLINE=${DEADLINE:-480}
    GTEST_TIMEOUT=200 LOGSUFFIX=_mq4 gtest test_cuda_quant DSQ_TEST_FILTER=test_q4_mma* DSQ_CUDA_Q4_MMA=8 \
        DSQ_CUDA_Q8_MMA=8
    grep -hE "gemv mma q|dsq_cu_linear q. [0-9]+x[0-9]+ T=[18]:|FAIL|ERROR" "$OUT/test_cuda_quant_mq4.log" | head -14
    GTEST_TIMEOUT=200 LOGSUFFIX=_mq4t gtest test_cuda_quant DSQ_TEST_FILTER=test_timing_q4_mma
    sed -n '/quantized products, us per call/,$p' "$OUT/test_cuda_quant_mq4t.log" | head -40
    LOGSUFFIX=_mq4 gtest test_cuda_quant_e2e DSQ_CUDA_Q4_MMA=2 DSQ_CUDA_Q8_MMA=2
    if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then # memcheck of the new kernel's tests
        DSQ_TEST_FILTER=test_q4_mma_gemv timeout 200 compute-sanitizer --tool memcheck "$B/tests/test_cuda_quant" \
            >"$OUT/memcheck_mq4.log" 2>&1
        echo "== memcheck rc=$? ($(el)) $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_mq4.log" | tr '\n' ' ')"
    fi
    if [ "${QUICK:-0}" != 1 ]; then # QUICK=1: the quantized kernel's tests and rows only
        gtest test_cuda_e2e
        gtest test_cuda_step_greedy
        LOGSUFFIX=_mma gtest test_cuda_kernels DSQ_TEST_FILTER=test_gemv_mma*
    fi
    bench_start
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA=1 bench_row q4_mma_r$rep 512 1 --kv f16 --quantize q4
        bench_row q4b2_r$rep 512 2 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA=2 bench_row q4b2_mma_r$rep 512 2 --kv f16 --quantize q4
    done
    DSQ_CUDA_Q4_MMA=8 bench_row q4b8_mma 512 8 --kv f16 --quantize q4
    bench_row q4b8 512 8 --kv f16 --quantize q4
    for rep in $(seq 1 ${REPS:-2}); do
        bench_row q8_r$rep 512 1 --kv f16 --quantize int8
        DSQ_CUDA_Q8_MMA=1 bench_row q8_mma_r$rep 512 1 --kv f16 --quantize int8
    done
    DSQ_CUDA_Q8_MMA=8 bench_row q8b8_mma 512 8 --kv f16 --quantize int8
    bench_row q8b8 512 8 --kv f16 --quantize int8
    bench_row b8 512 8 --kv f16
    DSQ_CUDA_MMA_NORM=0 bench_row b8_nomn 512 8 --kv f16
    bench_row b4 512 4 --kv f16
    DSQ_CUDA_MMA_NORM=0 bench_row b4_nomn 512 4 --kv f16
    if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
        ncu_k() { # name regex skip count prompt_len batch args...
            local name=$1 rx=$2 skip=$3 cnt=$4 pl=$5 bt=$6
            shift 6
            timeout 150 ncu --clock-control none -k regex:$rx --launch-skip $skip --launch-count $cnt \
                --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
                --section MemoryWorkloadAnalysis --section SchedulerStats \
                "$B/examples/dsqwen" bench --model $M --prompt-len $pl --max-tokens 4 --batch $bt "$@" \
                >"$OUT/ncu_$name.log" 2>&1
            echo "== ncu $name rc=$? ($(el))"
            grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Grid Size|Block Size|Dynamic Shared|[Ss]tall" \
                "$OUT/ncu_$name.log" | head -${NCU_ROWS:-60}
        }
        ncu_k q4gu gemm_rows_kernel 40 1 512 1 --kv f16 --quantize q4
        DSQ_CUDA_Q4_MMA=1 ncu_k q4gu_mma gemv_mma_quant 40 1 512 1 --kv f16 --quantize q4
    fi
    ;;
defaults40)
    # stop 40's defaults, measured before only through their knobs: the
    # one-split decode output (DSQ_CUDA_DECODE_DIRECT now on) and the 4-bit
    # GEMV's 64 x 2 blocks for qkv / o at one row (was 64 x 4).  The tests
    # that cover them with the defaults, then rows beside the old paths.
    prebuilt_stage defaults40
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=200 gtest test_cuda_attention
    grep -E "direct output|DIFFERENT|FAIL" "$OUT/test_cuda_attention.log" | sort | uniq -c | head -8
    gtest test_cuda_quant_e2e
    gtest test_cuda_step_greedy
    bench_start
    for rep in 1 2; do
        bench_row q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_Q4_GEMV_SHORT=64x4 bench_row q4_64x4_r$rep 512 1 --kv f16 --quantize q4
    done
    bench_row q4_none 512 1 --kv f16 --quantize q4 --sampling none
    bench_row b256_int8 1024 256 --kv int8
    DSQ_CUDA_DECODE_DIRECT=0 bench_row b256_int8_merge 1024 256 --kv int8
    ;;
sampdraw)
    # stop 40: the top-p draw's rank search by the whole block (was one warp
    # walking its ~4,700-id range, a load round trip per 32 ids), and its
    # per-range sums taken with find_cut's last gather pass
    # (DSQ_SAMPLE_DRAW_FUSED=1, "fused"; the default since the stop-40 run:
    # "new" rows pin it off).  The same tokens
    # must come out: `dsqwen generate` with fixed seeds on the full-size
    # random model (near-flat rows) against the base tree's binaries (the
    # tree before), on one CTA per row, clusters of 2 / 4 and the automatic
    # 16; then test_cuda_sampling (chi-square, paths, fused == not, timing
    # both ways) and bench rows beside the base tree's.  Prebuilt only.
    prebuilt_stage sampdraw
    DEADLINE=${DEADLINE:-540}
    base_tree || { echo "sampdraw: needs the base tree (.gpu/base.tar.xz or pack_prebuilt.sh BASE=DIR)"; exit 1; }
    wait $MODEL_PID
    nd=0
    for cfg in "0 11 --top-p 0.95" "2 12 --top-p 0.9 --top-k 500" "auto 13 --top-p 0.95 --repeat-penalty 1.1" \
               "0 14 --top-p 0.5 --min-p 0.01" "4 15 --top-p 0.99"; do
        set -- $cfg
        cl=$1 seed=$2
        shift 2
        for tag in base new fused; do
            BB=$B; [ $tag = base ] && BB=/tmp/gs_base
            DSQ_SAMPLE_DRAW_FUSED=$([ $tag = fused ] && echo 1 || echo 0) DSQ_SAMPLE_CLUSTER=$cl \
                LD_LIBRARY_PATH=$BB:$LD_LIBRARY_PATH timeout 60 "$BB/examples/dsqwen" generate \
                --model $M --tokens 1,2,3,4 --seed $seed --max-tokens 96 --temperature 0.6 "$@" \
                >"$OUT/gen_${tag}_$seed.txt" 2>"$OUT/gen_${tag}_$seed.err"
            echo "rc=$?" >>"$OUT/gen_${tag}_$seed.err"
        done
        for tag in new fused; do
            if cmp -s "$OUT/gen_base_$seed.txt" "$OUT/gen_${tag}_$seed.txt" && [ -s "$OUT/gen_${tag}_$seed.txt" ]; then
                echo "generate $tag cl=$cl seed=$seed $*: same output ($(wc -c <"$OUT/gen_${tag}_$seed.txt") bytes)"
            else
                nd=$((nd + 1))
                echo "generate $tag cl=$cl seed=$seed $*: DIFFERENT or empty"
                tail -2 "$OUT/gen_base_$seed.err" "$OUT/gen_${tag}_$seed.err"
            fi
        done
    done
    echo "== generate: $nd of 10 differ from the base tree"
    GTEST_TIMEOUT=200 gtest test_cuda_sampling
    grep -E "paths:|timing:.*top-p 0.95 +[0-9]" "$OUT/test_cuda_sampling.log" | head -24
    LOGSUFFIX=_fused GTEST_TIMEOUT=100 gtest test_cuda_sampling DSQ_TEST_FILTER=test_timing DSQ_SAMPLE_DRAW_FUSED=1
    grep -E "timing:.*top-p 0.95 +[0-9]" "$OUT/test_cuda_sampling_fused.log" | head -12
    bench_header
    for rep in 1 2; do
        base_row base_b64_r$rep 1024 64 --kv f16
        DSQ_SAMPLE_DRAW_FUSED=0 bench_row new_b64_r$rep 1024 64 --kv f16
        DSQ_SAMPLE_DRAW_FUSED=1 bench_row fused_b64_r$rep 1024 64 --kv f16
    done
    base_row base_b256_int8 1024 256 --kv int8
    DSQ_SAMPLE_DRAW_FUSED=0 bench_row new_b256_int8 1024 256 --kv int8
    DSQ_SAMPLE_DRAW_FUSED=1 bench_row fused_b256_int8 1024 256 --kv int8
    base_row base_b1 512 1 --kv f16
    DSQ_SAMPLE_DRAW_FUSED=0 bench_row new_b1 512 1 --kv f16
    DSQ_SAMPLE_DRAW_FUSED=1 bench_row fused_b1 512 1 --kv f16
    ;;
samp)
    # GPU sampling at 64 and 256 rows (stop 40): the automatic rule runs one
    # CTA per row at 256 rows (all clusters of 2 would not be resident at
    # once); the timing table adds forced clusters of 2 / 4 / 8 there and at
    # 64 rows, then bench rows with the cluster size forced (every cluster
    # size draws the same bits: test_cuda_sampling's path tests).
    prebuilt_stage samp
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=200 gtest test_cuda_sampling
    grep -E "timing:" "$OUT/test_cuda_sampling.log" | head -40
    bench_start
    for cl in auto 2 4; do
        DSQ_SAMPLE_CLUSTER=$cl bench_row samp_b256_int8_cl$cl 1024 256 --kv int8
    done
    for cl in auto 4; do
        DSQ_SAMPLE_CLUSTER=$cl bench_row samp_b64_cl$cl 1024 64 --kv f16
    done
    ;;
q4gemv)
    # 4-bit products of 1-2 rows (stops 38-39): the default (qkv, o and
    # down on gemv.cu's 4-bit GEMV, DSQ_CUDA_QROWS_Q4_MIN=3; gate/up on
    # gemm_rows.cu with the one-wave split fill at 1-2 rows) against the
    # path before stop 39 ("before" rows: DSQ_CUDA_QROWS_Q4_MIN=1
    # DSQ_CUDA_ROWS_FILL=0) and each change alone ("gemv": fill off,
    # "fill": the GEMV off).  The quantized kernel tests (the timing table's
    # "old kernel" column is gemv_quant.cu's Q4 GEMV, "rows planned" the
    # default plan), bench rows interleaved, then the e2e tests (the
    # quantized one also runs the path before).  Prebuilt only.
    prebuilt_stage q4gemv
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=240 gtest test_cuda_quant
    grep -E "worst|SKIP|dsq_cu_linear|^ +q4 .* +[1248] " "$OUT/test_cuda_quant.log" | head -40
    bench_start
    for rep in 1 2; do
        bench_row def_q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QROWS_Q4_MIN=1 DSQ_CUDA_ROWS_FILL=0 bench_row before_q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_ROWS_FILL=0 bench_row gemv_q4_r$rep 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QROWS_Q4_MIN=1 bench_row fill_q4_r$rep 512 1 --kv f16 --quantize q4
    done
    for sh in 128x4 128x2 64x2 32x4; do # qkv and o's block shape (gemv.cu, 1-2 rows)
        DSQ_CUDA_Q4_GEMV_SHORT=$sh bench_row short${sh}_q4 512 1 --kv f16 --quantize q4
    done
    for b in 2 8; do
        bench_row def_q4_b$b 512 $b --kv f16 --quantize q4
        DSQ_CUDA_QROWS_Q4_MIN=1 DSQ_CUDA_ROWS_FILL=0 bench_row before_q4_b$b 512 $b --kv f16 --quantize q4
    done
    bench_row def_q4_none 512 1 --kv f16 --quantize q4 --sampling none
    DSQ_CUDA_QROWS_Q4_MIN=1 DSQ_CUDA_ROWS_FILL=0 bench_row before_q4_none 512 1 --kv f16 --quantize q4 --sampling none
    bench_row def_q4_8k 8192 1 --kv f16 --quantize q4
    DSQ_CUDA_QROWS_Q4_MIN=1 DSQ_CUDA_ROWS_FILL=0 bench_row before_q4_8k 8192 1 --kv f16 --quantize q4
    bench_row def_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_ROWS_FILL=0 bench_row before_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    bench_row def_q8_b8 512 8 --kv f16 --quantize int8
    bench_row def_bf16 512 1 --kv f16
    gtest test_cuda_quant_e2e
    gtest test_cuda_e2e
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    ;;
q8gemv)
    # stop 35: INT8 (Q8_ROW) products of 1..8 rows in gemv.cu's kernel
    # (loads in flight, PDL, the RMSNorm folded in at 1-4 rows) where
    # DSQ_CUDA_Q8_GEMV says (default: N < 16384): the quantized kernel
    # tests (timing table with the older kernel's column), the quantized
    # e2e tests, the bf16 GEMV and e2e tests, then batch-1 INT8 rows for
    # each policy against the base tree (.gpu/base.tar.xz, same card).
    # Prebuilt only.
    prebuilt_stage q8gemv
    DEADLINE=${DEADLINE:-560}
    GTEST_TIMEOUT=240 gtest test_cuda_quant
    grep -E "worst|^ +q8 " "$OUT/test_cuda_quant.log" | head -40
    gtest test_cuda_quant_decode
    gtest test_cuda_quant_e2e
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    gtest test_cuda_e2e
    base_tree || { echo "q8gemv: needs .gpu/base.tar.xz"; exit 1; }
    bench_start
    for rep in 1 2; do
        base_row base_q8h_r$rep 512 1 --kv f16 --quantize int8 --quantize-head
        bench_row new_q8h_r$rep 512 1 --kv f16 --quantize int8 --quantize-head
    done
    DSQ_CUDA_Q8_GEMV=new bench_row allnew_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_Q8_GEMV=old bench_row old_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    base_row base_q8h_none 512 1 --kv f16 --quantize int8 --quantize-head --sampling none
    bench_row new_q8h_none 512 1 --kv f16 --quantize int8 --quantize-head --sampling none
    base_row base_q8_b2 512 2 --kv f16 --quantize int8
    bench_row new_q8_b2 512 2 --kv f16 --quantize int8
    base_row base_b1_512 512 1 --kv f16
    bench_row new_b1_512 512 1 --kv f16
    ;;
rowswg)
    # stop 36: the up-to-64-row products on Hopper's wgmma (gemm_rows_wg.cu,
    # DSQ_CUDA_ROWS_WG): both kernels' tests against the CPU products (bf16,
    # Q8, Q4; the timing tables' "rows wg" columns), the e2e tests through
    # it, then batch-64/8 rows with it against the defaults, interleaved.
    # Prebuilt only.
    prebuilt_stage rowswg
    DEADLINE=420
    GTEST_TIMEOUT=150 gtest test_cuda_quant
    grep -E "worst|kernel|SKIP|^ +q[48] .* (8|16|64) " "$OUT/test_cuda_quant.log" | head -40
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    grep -E "gemm_rows bf16|SKIP|^ +(qkv|o |gate|down|lm_head).* (8|16|64) " "$OUT/test_cuda_kernels.log" | head -30
    LOGSUFFIX=_wg GTEST_TIMEOUT=60 gtest test_cuda_quant_e2e DSQ_CUDA_ROWS_WG=2
    LOGSUFFIX=_wg GTEST_TIMEOUT=60 gtest test_cuda_e2e DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_ROWS_WG=2
    bench_start
    bench_row def_b64 1024 64 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_ROWS_WG=1 bench_row wg_b64 1024 64 --kv f16
    bench_row def_b64_q4 1024 64 --kv f16 --quantize q4
    DSQ_CUDA_ROWS_WG=1 bench_row wg_b64_q4 1024 64 --kv f16 --quantize q4
    bench_row def_b64_q8 1024 64 --kv f16 --quantize int8
    DSQ_CUDA_ROWS_WG=1 bench_row wg_b64_q8 1024 64 --kv f16 --quantize int8
    bench_row def_b8 512 8 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_ROWS_WG=1 bench_row wg_b8 512 8 --kv f16
    bench_row def_b8_q4 512 8 --kv f16 --quantize q4
    DSQ_CUDA_ROWS_WG=2 bench_row wg_b8_q4 512 8 --kv f16 --quantize q4
    bench_row def_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_Q8_SMALL=128 bench_row w128_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    ;;
rowswg2)
    # stop 36: the default after rowswg (gemm_rows_wg.cu from 32 rows; on
    # tag q4slots-wip-stop36 Q4 with a 4-slot ring): the quantized tests,
    # then batch-64 rows with the default against DSQ_CUDA_ROWS_WG=0
    # (gemm_rows.cu's kernel), twice, interleaved.  Prebuilt only.
    prebuilt_stage rowswg2
    DEADLINE=${DEADLINE:-300}
    GTEST_TIMEOUT=150 gtest test_cuda_quant
    grep -E "worst|SKIP|^ +q4 .* (16|64) " "$OUT/test_cuda_quant.log" | head -30
    gtest test_cuda_quant_e2e
    LOGSUFFIX=_wg gtest test_cuda_quant_e2e DSQ_CUDA_ROWS_WG=2
    bench_start
    for rep in 1 2; do
        bench_row def_b64_q4_r$rep 1024 64 --kv f16 --quantize q4
        DSQ_CUDA_ROWS_WG=0 bench_row mma_b64_q4_r$rep 1024 64 --kv f16 --quantize q4
    done
    bench_row def_b64_q8 1024 64 --kv f16 --quantize int8
    DSQ_CUDA_ROWS_WG=0 bench_row mma_b64_q8 1024 64 --kv f16 --quantize int8
    bench_row def_b64 1024 64 --kv f16
    bench_row def_b64_q4_none 1024 64 --kv f16 --quantize q4 --sampling none
    bench_row def_b8_q4 512 8 --kv f16 --quantize q4
    ;;
plan)
    # stop 37, second call: gemm_rows_wg.cu's ring depth chosen per launch
    # and splits planned without the quantized cap (this tree) against
    # base = tag wgslots-wip-stop36's build and alt = the first call's new
    # tree (float4 fix-up, Q4 scales ahead, W in registers; 3 slots,
    # capped plan), from .gpu/trees.tar.xz; DSQ_CUDA_ROWS_WG_PLAN=1 rows;
    # the golden e2e checks with the kernel at every row count.  Prebuilt only.
    prebuilt_stage plan
    DEADLINE=300
    GTEST_TIMEOUT=200 gtest test_cuda_quant
    grep -E "worst|SKIP|^ +q[48] .* (16|64) " "$OUT/test_cuda_quant.log" | head -40
    two_trees plan
    bench_start
    DEADLINE=360
    for rep in 1 2; do
        bench_row new_b64_q4_r$rep 1024 64 --kv f16 --quantize q4
        alt_row alt_b64_q4_r$rep 1024 64 --kv f16 --quantize q4
    done
    DSQ_CUDA_ROWS_WG_PLAN=1 bench_row cap_b64_q4 1024 64 --kv f16 --quantize q4
    bench_row new_b64_q8 1024 64 --kv f16 --quantize int8
    alt_row alt_b64_q8 1024 64 --kv f16 --quantize int8
    base_row base_b64_q4 1024 64 --kv f16 --quantize q4
    bench_row def_b64 1024 64 --kv f16
    bench_row new_b64_q4_none 1024 64 --kv f16 --quantize q4 --sampling none
    bench_row def_b64_none 1024 64 --kv f16 --sampling none
    bench_row new_b32_q4 1024 32 --kv f16 --quantize q4
    alt_row alt_b32_q4 1024 32 --kv f16 --quantize q4
    DSQ_CUDA_ROWS_WG=0 bench_row mma_b32_q4 1024 32 --kv f16 --quantize q4
    DSQ_CUDA_GEMM_ROWS=64 bench_row new_b64_bf16wg 1024 64 --kv f16
    DEADLINE=460
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    grep -E "SKIP|FAIL" "$OUT/test_cuda_kernels.log" | head -12
    gtest test_cuda_quant_e2e DSQ_CUDA_ROWS_WG=2
    gtest test_cuda_e2e DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_ROWS_WG=2
    ;;
fixup)
    # stop 37: the wgmma kernel (gemm_rows_wg.cu) three ways, same card,
    # interleaved: base = tag wgslots-wip-stop36's build, alt = (+ the split-K fix-up four outputs at a
    # time and Q4 scales a stage ahead), new = this tree (+ quantized W
    # held in registers 4 stages ahead); the ring depths on the new tree;
    # no-logits rows.  Prebuilt only.
    prebuilt_stage fixup
    DEADLINE=300
    GTEST_TIMEOUT=200 gtest test_cuda_quant
    grep -E "worst|SKIP|^ +q[48] .* (16|64) " "$OUT/test_cuda_quant.log" | head -40
    two_trees fixup
    bench_start
    DEADLINE=420
    bench_row new_b64_q4_r1 1024 64 --kv f16 --quantize q4
    base_row base_b64_q4_r1 1024 64 --kv f16 --quantize q4
    alt_row alt_b64_q4_r1 1024 64 --kv f16 --quantize q4
    bench_row new_b64_q8 1024 64 --kv f16 --quantize int8
    base_row base_b64_q8 1024 64 --kv f16 --quantize int8
    bench_row def_b64 1024 64 --kv f16
    bench_row new_b64_q4_none 1024 64 --kv f16 --quantize q4 --sampling none
    bench_row new_b64_q4_r2 1024 64 --kv f16 --quantize q4
    base_row base_b64_q4_r2 1024 64 --kv f16 --quantize q4
    for sl in 2 4; do
        DSQ_CUDA_ROWS_WG_SLOTS=$sl bench_row s${sl}_b64_q4 1024 64 --kv f16 --quantize q4
    done
    alt_row alt_b64_q8 1024 64 --kv f16 --quantize int8
    DSQ_CUDA_GEMM_ROWS=64 base_row base_b64_bf16wg 1024 64 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 bench_row new_b64_bf16wg 1024 64 --kv f16
    bench_row def_b64_none 1024 64 --kv f16 --sampling none
    DEADLINE=500
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    grep -E "gemm_rows bf16|gemm-rows|SKIP|FAIL" "$OUT/test_cuda_kernels.log" | head -12
    gtest test_cuda_quant_e2e DSQ_CUDA_ROWS_WG=2
    ;;
wgslots)
    # stop 36 (tag wgslots-wip-stop36): gemm_rows_wg.cu's ring depth
    # (DSQ_CUDA_ROWS_WG_SLOTS 2 / 3 / 4; 2 slots fit three blocks per SM
    # for bf16 and Q4): the tests run every depth, the quantized timing
    # table prints 2 / 4 beside 3, then batch-64 rows per depth,
    # interleaved, against the mma.sync kernel.  Prebuilt only.
    prebuilt_stage wgslots
    DEADLINE=${DEADLINE:-400}
    GTEST_TIMEOUT=200 gtest test_cuda_quant
    grep -E "worst|SKIP|^ +q[48] .* (16|64) " "$OUT/test_cuda_quant.log" | head -40
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    grep -E "gemm_rows bf16|SKIP|FAIL" "$OUT/test_cuda_kernels.log" | head -10
    bench_start
    for rep in 1 2; do
        for sl in 2 3 4; do
            DSQ_CUDA_ROWS_WG_SLOTS=$sl bench_row s${sl}_b64_q4_r$rep 1024 64 --kv f16 --quantize q4
        done
        DSQ_CUDA_ROWS_WG=0 bench_row mma_b64_q4_r$rep 1024 64 --kv f16 --quantize q4
    done
    for sl in 2 3 4; do
        DSQ_CUDA_ROWS_WG_SLOTS=$sl bench_row s${sl}_b64_q8 1024 64 --kv f16 --quantize int8
    done
    bench_row def_b64 1024 64 --kv f16
    ;;
q8shape)
    # stop 35: gemv.cu's C wrappers sharing one argument packer (the GEMV
    # tests) and the small Q8 products' shape at 1-2 rows
    # (DSQ_CUDA_Q8_SMALL=128 vs the default 64 x 4), interleaved.  Prebuilt only.
    prebuilt_stage q8shape
    DEADLINE=${DEADLINE:-400}
    GTEST_TIMEOUT=240 gtest test_cuda_quant
    grep -E "worst" "$OUT/test_cuda_quant.log" | head -8
    gtest test_cuda_quant_e2e
    GTEST_TIMEOUT=150 gtest test_cuda_kernels
    bench_start
    for rep in 1 2; do
        bench_row def_q8h_r$rep 512 1 --kv f16 --quantize int8 --quantize-head
        DSQ_CUDA_Q8_SMALL=128 bench_row w128_q8h_r$rep 512 1 --kv f16 --quantize int8 --quantize-head
    done
    bench_row def_q8_b2 512 2 --kv f16 --quantize int8
    DSQ_CUDA_Q8_SMALL=128 bench_row w128_q8_b2 512 2 --kv f16 --quantize int8
    ;;
b1ctx)
    # stop 34: a decode-attention change against the base tree
    # (.gpu/base.tar.xz, same card): test_cuda_attention and the e2e test on
    # this tree, then batch-1 bench rows at 8,192, 32,768 (paged) and 512
    # keys, base and new interleaved.  Prebuilt only.
    prebuilt_stage b1ctx
    DEADLINE=${DEADLINE:-560}
    GTEST_TIMEOUT=150 gtest test_cuda_attention
    gtest test_cuda_e2e
    base_tree || { echo "b1ctx: needs .gpu/base.tar.xz"; exit 1; }
    bench_start
    for rep in 1 2; do
        base_row base_b1_8192_r$rep 8192 1 --kv f16
        bench_row new_b1_8192_r$rep 8192 1 --kv f16
    done
    base_row base_b1_32768 32768 1 --kv f16 --kv-layout paged
    bench_row new_b1_32768 32768 1 --kv f16 --kv-layout paged
    for rep in 1 2; do
        base_row base_b1_512_r$rep 512 1 --kv f16
        bench_row new_b1_512_r$rep 512 1 --kv f16
    done
    ;;
check)
    # gpu_check.sh, first half: build, kernels, e2e (graphs on and off), the
    # full-size 1.5B comparison with HF fp32, two contexts on two threads,
    # then every ctest (test_cuda_step_greedy, _nccl, _tp's one-GPU cases,
    # _quant, _quant_e2e included)
    prebuilt && export SKIP_BUILD=1
    OUT=$OUT BUILD_DIR=$B SKIP_SHAPE7B=1 SKIP_MEMCHECK=1 bash scripts/gpu_check.sh
    ;;
check2)
    # the 7B-shape comparison with HF fp32 (issue 9), then issue 10's
    # quantized full-size check (every format vs HF fp32 on its dequantized
    # weights, device_bytes, tok/s)
    build
    timeout 330 python3 tests/fixtures/shape_check.py --lib "$B/libdsqwen.so" --variants "${SHAPE_VARIANTS:-nobias,bias}" \
        --config tests/data/configs/r1-distill-qwen-7b.json --out "$OUT" >"$OUT/shape7b.log" 2>&1
    echo "== shape7b rc=$? ($(el))"; tail -15 "$OUT/shape7b.log"
    # 2026-12-03 ran awq, gptq, gptq_sym (~150 s each; all pass): the rest
    # first, QFORMATS=all for every format
    QF=${QFORMATS:-gptq_v2,q8,q4}
    [ "$QF" = all ] && QF=awq,gptq,gptq_sym,gptq_v2,q8,q4
    DSQWEN_LIBRARY=$B/libdsqwen.so timeout 420 python3 tests/fixtures/quant_fullsize_check.py --formats "$QF" \
        --config tests/data/model/config.json --dir /tmp/dsq_qfull --out "$OUT" >"$OUT/quant_fullsize.log" 2>&1
    echo "== quant_fullsize rc=$? ($(el))"; tail -25 "$OUT/quant_fullsize.log"
    ;;
quant)
    # issue 10's full-size rows alone (one call): AWQ with and without the
    # int8 head (device_bytes of the 1.4 GB row), INT8 / Q4 as stored and
    # quantized at load (never finished on a GPU before stop 25); speed
    # only at batch 1 (bench rows measure speed); each format's ~9 GB of
    # files deleted after use
    build
    QF=${QFORMATS:-awq,q8,q4}
    [ "$QF" = all ] && QF=awq,gptq,gptq_sym,gptq_v2,q8,q4
    DSQWEN_LIBRARY=$B/libdsqwen.so timeout 560 python3 tests/fixtures/quant_fullsize_check.py --formats "$QF" \
        --config tests/data/model/config.json --dir /tmp/dsq_qfull --out "$OUT" --batches 1 --speed-steps 16 \
        --cleanup --reuse >"$OUT/quant_fullsize.log" 2>&1
    echo "== quant_fullsize rc=$? ($(el))"; grep -v "^ " "$OUT/quant_fullsize.log" | tail -25
    ;;
first)
    # One call for a session whose device time is short (a start that finds
    # no machine costs ~90 s): the GPU tests of the kernels changed since the
    # last GPU session, then the bench rows that decide their defaults, then
    # the other GPU tests while the deadline allows (the full-size model is
    # built on the CPU meanwhile).  Needs the prebuilt binaries.
    prebuilt_stage first
    DEADLINE=${DEADLINE:-540}
    echo "== GPU tests of stop 24's kernels (gemm_rows Q8/Q4, L2 prefetch, sampling passes, tile loaders)"
    for t in test_cuda_quant test_cuda_quant_e2e test_cuda_kernels test_cuda_e2e test_cuda_sampling; do gtest $t; done
    bench_start
    bench_row b1_512 512 1 --kv f16
    bench_row b1_512_q8 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_QROWS=64 bench_row b1_512_q8_rows 512 1 --kv f16 --quantize int8 --quantize-head
    bench_row b1_512_q4 512 1 --kv f16 --quantize q4
    DSQ_CUDA_QROWS=64 bench_row b1_512_q4_rows 512 1 --kv f16 --quantize q4
    bench_row b64_1024 1024 64 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 bench_row b64_1024_rows 1024 64 --kv f16
    bench_row b64_1024_q4 1024 64 --kv f16 --quantize q4
    DSQ_CUDA_QROWS=64 bench_row b64_1024_q4_rows 1024 64 --kv f16 --quantize q4
    DSQ_CUDA_QROWS=64 bench_row b8_512_q4_rows 512 8 --kv f16 --quantize q4
    bench_row b8_512 512 8 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 bench_row b8_512_rows 512 8 --kv f16
    DSQ_CUDA_L2_PREFETCH=8 bench_row b1_512_l2p8 512 1 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_GEMM_ROWS_MIN=1 bench_row b1_512_rows1 512 1 --kv f16
    echo "== the other GPU tests"
    for t in test_cuda_step_greedy test_cuda_seq_ops test_cuda_nonfinite test_cuda_loader test_cuda_device_oom \
        test_cuda_threads; do gtest $t; done
    gtest test_cuda_attention DSQ_ATTN_QUICK=1
    ;;
qrows)
    # the quantized products' defaults (gemm_rows.cu for Q4 from 1 row, Q8
    # from 3, up to 64; planned split counts; prompts on the exact two-part
    # tile): their GPU tests and timing table, the bench rows beside the
    # previous paths (DSQ_CUDA_QROWS=0, DSQ_CUDA_QTILE=1),
    # then the full-size comparison of the bf16 source (the baseline of the
    # quantized rows' argmax) and of INT8 at load with an int8 head (the
    # 2.1 GB row) while the deadline allows.  Prebuilt only.
    prebuilt_stage qrows
    DEADLINE=${DEADLINE:-300}
    quant_tests "worst|bit-identical|GPU vs CPU"
    bench_start
    # pairs: the default, then the previous path (any card: compare within a run)
    bench_row b1_512_q4 512 1 --kv f16 --quantize q4
    DSQ_CUDA_QROWS=0 bench_row b1_512_q4_off 512 1 --kv f16 --quantize q4
    # the prompt (one 512-row chunk) through one bf16-rounded tile part
    # instead of the exact two: prefill_t/s is the cost of exactness
    DSQ_CUDA_QTILE=1 bench_row b1_512_q4_tile1 512 1 --kv f16 --quantize q4
    bench_row b8_512_q8h 512 8 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_QROWS=0 bench_row b8_512_q8h_off 512 8 --kv f16 --quantize int8 --quantize-head
    bench_row b64_1024_q8h 1024 64 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_QROWS=0 bench_row b64_1024_q8h_off 1024 64 --kv f16 --quantize int8 --quantize-head
    bench_row b8_512_q4 512 8 --kv f16 --quantize q4
    bench_row b64_1024_q4 1024 64 --kv f16 --quantize q4
    bench_row b1_512_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_QROWS_Q8_MIN=1 bench_row b1_512_q8h_rows 512 1 --kv f16 --quantize int8 --quantize-head
    qfull_rows "${QFORMATS:-bf16,q8}"
    ;;
tile)
    # the dequantization tile of quantized prompts (stop 27: 8 weights per
    # thread, 16-byte stores; Q8 on its codes, the row scales in the
    # epilogue): its tests, the prompt rows beside bf16 and
    # beside one rounded part (DSQ_CUDA_QTILE=1), where a 512-token
    # prompt's time goes (kernel_profile), then the full-size argmax rows
    # of the bf16 source and AWQ with their misses' margins.  Prebuilt only.
    prebuilt_stage tile
    DEADLINE=${DEADLINE:-540}
    quant_tests "tile path|FAIL|ERROR"
    bench_start
    bench_row b1_512 512 1 --kv f16
    bench_row b1_512_q4 512 1 --kv f16 --quantize q4
    DSQ_CUDA_QTILE=1 bench_row b1_512_q4_tile1 512 1 --kv f16 --quantize q4
    bench_row b1_512_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_QTILE=1 bench_row b1_512_q8h_tile1 512 1 --kv f16 --quantize int8 --quantize-head
    bench_row b1_4096 4096 1 --kv f16
    bench_row b1_4096_q4 4096 1 --kv f16 --quantize q4
    export DSQWEN_LIBRARY=$B/libdsqwen.so
    timeout 90 python3 tests/bench/kernel_profile.py --model $M --json "$OUT/prefill_512_q4.json" --prefill 512 \
        --steps 4 --warm 2 --quantize q4 >"$OUT/prefill_512_q4.log" 2>&1
    echo "== kernel_profile q4 prefill 512 rc=$? ($(el))"; head -14 "$OUT/prefill_512_q4.log"
    qfull_rows "${QFORMATS:-bf16,awq}"
    ;;
tune)
    # cuBLASLt tuning of the decode graphs' products (stop 28,
    # DSQ_CUDA_GEMM_TUNE=1, off by default; written without a GPU): its
    # test and the product table's heuristic-vs-tuned columns, the golden
    # e2e and greedy tests with tuning on, stop 27's unrun quant fixes, then
    # bench pairs (default, tuned) at the batch sizes whose products run on
    # cuBLASLt.  Prebuilt only.
    prebuilt_stage tune
    DEADLINE=${DEADLINE:-540}
    GTEST_TIMEOUT=200 gtest test_cuda_kernels # the product table times 30 tunings more
    grep -E "gemm tune|gemm tuned" "$OUT/test_cuda_kernels.log" | head -8
    # the product table's rows of 16 and 64 rows (T: columns 24-26)
    awk 'substr($0, 3, 5) == "shape" || substr($0, 24, 3) + 0 == 16 || substr($0, 24, 3) + 0 == 64' \
        "$OUT/test_cuda_kernels.log" | head -12
    LOGSUFFIX=_tune gtest test_cuda_e2e DSQ_CUDA_GEMM_TUNE=1
    LOGSUFFIX=_tune gtest test_cuda_step_greedy DSQ_CUDA_GEMM_TUNE=1
    gtest test_cuda_quant
    bench_start
    bench_row b64_1024 1024 64 --kv f16
    DSQ_CUDA_GEMM_TUNE=1 bench_row b64_1024_tune 1024 64 --kv f16
    bench_row b8_512 512 8 --kv f16
    DSQ_CUDA_GEMM_TUNE=1 bench_row b8_512_tune 512 8 --kv f16
    bench_row b256_1024_int8 1024 256 --kv int8
    DSQ_CUDA_GEMM_TUNE=1 bench_row b256_1024_int8_tune 1024 256 --kv int8
    bench_row b64_1024_none 1024 64 --kv f16 --sampling none
    DSQ_CUDA_GEMM_TUNE=1 bench_row b64_1024_none_tune 1024 64 --kv f16 --sampling none
    # mode 2: prompts and mixed steps too (prefill_t/s; the bench's warm-up
    # round pays the timing)
    bench_row b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096
    DSQ_CUDA_GEMM_TUNE=2 bench_row b1_4096_1pass_tune2 4096 1 --kv f16 --batch-tokens 4096
    bench_row b1_512 512 1 --kv f16
    DSQ_CUDA_GEMM_TUNE=2 bench_row b1_512_tune2 512 1 --kv f16
    if [ -x "$B/tests/bench_mixed_step" ]; then
        for tv in 0 2; do mixed_row tune$tv $B DSQ_CUDA_GEMM_TUNE=$tv; done
    fi
    ;;
pieces)
    # stop 30: a decode step's graph launched in pieces over the layers
    # (DSQ_CUDA_GRAPH_PIECES=4; default 1 = one graph per step, until measured):
    # cudaGraphLaunch of the whole step took ~140 us of host time before the
    # GPU started.  Tests with both, bench pairs (alternating, twice where
    # the step is short), a sampled-step timeline.  Prebuilt only.
    prebuilt_stage pieces
    DEADLINE=${DEADLINE:-540}
    gtest test_cuda_e2e
    LOGSUFFIX=_p4 gtest test_cuda_e2e DSQ_CUDA_GRAPH_PIECES=4
    LOGSUFFIX=_p4 gtest test_cuda_step_greedy DSQ_CUDA_GRAPH_PIECES=4
    LOGSUFFIX=_p4 gtest test_cuda_seq_ops DSQ_CUDA_GRAPH_PIECES=4
    LOGSUFFIX=_p4 gtest test_cuda_quant_e2e DSQ_CUDA_GRAPH_PIECES=4
    bench_start
    for rep in 1 2; do
        DSQ_CUDA_GRAPH_PIECES=4 bench_row b1_512_r$rep 512 1 --kv f16
        bench_row b1_512_p1_r$rep 512 1 --kv f16
        DSQ_CUDA_GRAPH_PIECES=2 bench_row b1_512_p2_r$rep 512 1 --kv f16
    done
    DSQ_CUDA_GRAPH_PIECES=4 bench_row b1_512_none 512 1 --kv f16 --sampling none
    bench_row b1_512_none_p1 512 1 --kv f16 --sampling none
    for rep in 1 2; do
        DSQ_CUDA_GRAPH_PIECES=4 bench_row b8_512_r$rep 512 8 --kv f16
        bench_row b8_512_p1_r$rep 512 8 --kv f16
    done
    DSQ_CUDA_GRAPH_PIECES=4 bench_row b64_1024 1024 64 --kv f16
    bench_row b64_1024_p1 1024 64 --kv f16
    DSQ_CUDA_GRAPH_PIECES=4 bench_row b256_1024_int8 1024 256 --kv int8
    bench_row b256_1024_int8_p1 1024 256 --kv int8
    DSQ_CUDA_GRAPH_PIECES=4 bench_row b1_512_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    bench_row b1_512_q8h_p1 512 1 --kv f16 --quantize int8 --quantize-head
    DSQ_CUDA_GRAPH_PIECES=4 bench_row b1_8192 8192 1 --kv f16
    bench_row b1_8192_p1 8192 1 --kv f16
    export PYTHONUNBUFFERED=1 DSQWEN_LIBRARY=$B/libdsqwen.so
    DSQ_CUDA_GRAPH_PIECES=4 timeout 90 python3 tests/bench/kernel_profile.py --model $M --json "$OUT/b1_512_s.json" --batch 1 --context 512 \
        --sample >"$OUT/b1_512_s.log" 2>&1
    echo "== kernel_profile b1 512 sampled rc=$? ($(el))"
    grep -E "^wall|^host time" "$OUT/b1_512_s.log"
    sed -n '/^timeline/,$p' "$OUT/b1_512_s.log" | head -14
    ;;
prompt)
    # stop 32: short prompts (issue 8's prefill 512 / time to first token
    # rows, issue 7's mixed step): prefill attention alone (test_cuda_
    # attention's timing rows at 128 / 512 rows and 512-row chunks, split
    # plan and none), the e2e tests, TTFT bench rows and the mixed step;
    # with .gpu/base.tar.xz (an earlier tree's prebuilt archive) the same
    # rows of that tree first, on the same card.  PROMPT_NCU=1: ncu of the
    # fp16 prefill kernels of the timing rows.  Prebuilt only.
    prebuilt_stage prompt
    DEADLINE=${DEADLINE:-540}
    prompt_rows() { # tag build_dir
        local tag=$1 BB=$2
        LD_LIBRARY_PATH=$BB:$LD_LIBRARY_PATH timeout 200 "$BB/tests/test_cuda_attention" >"$OUT/attn_$tag.log" 2>&1
        echo "== $tag: test_cuda_attention rc=$? ($(el)) $(grep -E "PASSED|FAILED" "$OUT/attn_$tag.log" | tail -1)"
        grep -E "prefill .*(rows|tokens)" "$OUT/attn_$tag.log" | head -18
        wait $MODEL_PID
        # --sampling none: prefill of P - 1 tokens with the last row's
        # logits in both trees (the default's prefill_ms changed meaning at
        # stop 32: call to first sampled token)
        for rep in 1 2; do
            for pl in 512 128; do
                LD_LIBRARY_PATH=$BB:$LD_LIBRARY_PATH B=$BB bench_row ${tag}_b1_${pl}n_r$rep $pl 1 --kv f16 --sampling none
            done
        done
        LD_LIBRARY_PATH=$BB:$LD_LIBRARY_PATH B=$BB bench_row ${tag}_b1_512 512 1 --kv f16
        mixed_row $tag $BB
    }
    if [ -f .gpu/base.tar.xz ]; then
        base_tree
        prompt_rows base /tmp/gs_base
    fi
    prompt_rows new $B
    for t in test_cuda_e2e test_cuda_seq_ops test_cuda_step_greedy; do gtest $t; done
    if [ "${PROMPT_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
        DSQ_ATTN_PROFILE=1 timeout 150 ncu --clock-control none -k regex:prefill_kernel --launch-count 9 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
            "$B/tests/test_cuda_attention" >"$OUT/ncu_prefill.log" 2>&1
        echo "== ncu rc=$? ($(el))"
        grep -E "prefill_kernel|Duration|Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued" "$OUT/ncu_prefill.log" | head -60
    fi
    ;;
wgmma)
    # stop 33: prefill attention on wgmma (sm_90a) against the mma.sync
    # kernel: test_cuda_attention (every prefill case with both kernels, the
    # timing rows of both), the e2e tests, the mixed step and prefill bench
    # rows of the base tree (.gpu/base.tar.xz), the default and
    # DSQ_CUDA_PREFILL_WGMMA=0.  WG_SAN=1: compute-sanitizer memcheck and
    # racecheck of test_cuda_attention (quick).  Prebuilt only.
    prebuilt_stage wgmma
    DEADLINE=${DEADLINE:-540}
    timeout 240 "$B/tests/test_cuda_attention" >"$OUT/attn.log" 2>&1
    echo "== test_cuda_attention rc=$? ($(el)) $(grep -E "PASSED|FAILED" "$OUT/attn.log" | tail -1)"
    grep -E "prefill kernels tested|FAIL|worst rel|mismatched [1-9]" "$OUT/attn.log" | head -12
    grep -E "f16 +(wgmma|mma) +prefill .*(rows|tokens)" "$OUT/attn.log" | head -30
    grep -E "int8 +(wgmma|mma) +prefill (1 x|512 rows at 1536)" "$OUT/attn.log"
    if [ "${WG_SAN:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
        for tool in memcheck racecheck; do
            DSQ_ATTN_QUICK=1 timeout 200 compute-sanitizer --tool $tool "$B/tests/test_cuda_attention" \
                >"$OUT/san_$tool.log" 2>&1
            echo "== $tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/san_$tool.log" | tr '\n' ' ')"
        done
    fi
    base_tree
    wait $MODEL_PID
    for t in test_cuda_e2e test_cuda_step_greedy test_cuda_seq_ops; do gtest $t; done
    mixed_row base /tmp/gs_base
    mixed_row new $B
    mixed_row new_mma $B DSQ_CUDA_PREFILL_WGMMA=0
    for rep in 1 2; do
        bench_row new_b1_512n_r$rep 512 1 --kv f16 --sampling none
        DSQ_CUDA_PREFILL_WGMMA=0 bench_row mma_b1_512n_r$rep 512 1 --kv f16 --sampling none
    done
    bench_row new_b1_4096n 4096 1 --kv f16 --sampling none --batch-tokens 4096
    DSQ_CUDA_PREFILL_WGMMA=0 bench_row mma_b1_4096n 4096 1 --kv f16 --sampling none --batch-tokens 4096
    bench_row new_b1_512 512 1 --kv f16
    DSQ_CUDA_PREFILL_WGMMA=0 bench_row mma_b1_512 512 1 --kv f16
    ;;
targets)
    # stop 33: the rows of issues 7, 8 and 10's targets tables, on the
    # prebuilt tree, as users run them (sampling in the library, beside the
    # no-logits rows), and the mixed step; with .gpu/base.tar.xz, that
    # tree's prefill attention timing rows beside this one's first (same
    # card).  Prebuilt only.
    prebuilt_stage targets
    DEADLINE=${DEADLINE:-560}
    if [ -f .gpu/base.tar.xz ]; then
        base_tree
        for tag in base new; do
            BB=$B; [ $tag = base ] && BB=/tmp/gs_base
            LD_LIBRARY_PATH=$BB:$LD_LIBRARY_PATH timeout 150 "$BB/tests/test_cuda_attention" >"$OUT/attn_$tag.log" 2>&1
            echo "== $tag test_cuda_attention rc=$? $(grep -E "PASSED|FAILED" "$OUT/attn_$tag.log" | tail -1)"
            grep -E "f16 +wgmma +prefill (1 x|512 rows at +(0|1536|3584) .split plan|128 rows at +0 .split)" "$OUT/attn_$tag.log"
        done
    fi
    wait $MODEL_PID
    if [ "${TARGETS_MIXED_ONLY:-0}" = 1 ]; then
        mixed_row base /tmp/gs_base
        mixed_row new $B
        base_row base_b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096
        bench_row new_b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096
        exit 0
    fi
    bench_header
    bench_row b1_512 512 1 --kv f16
    bench_row b1_512_none 512 1 --kv f16 --sampling none
    bench_row b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096
    bench_row b1_8192 8192 1 --kv f16
    bench_row b8_512 512 8 --kv f16
    bench_row b64_1024 1024 64 --kv f16
    bench_row b64_1024_none 1024 64 --kv f16 --sampling none
    bench_row b256_1024_int8 1024 256 --kv int8
    bench_row b64_4096_f16 4096 64 --kv f16
    bench_row b64_4096_int8 4096 64 --kv int8
    bench_row b1_512_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    bench_row b1_512_q4 512 1 --kv f16 --quantize q4
    bench_row b64_1024_q4 1024 64 --kv f16 --quantize q4      # issue 10: >= b64_1024
    bench_row b64_1024_q4_none 1024 64 --kv f16 --quantize q4 --sampling none
    bench_row b64_1024_q8 1024 64 --kv f16 --quantize int8
    mixed_row step $B
    bench_row b1_32768 32768 1 --kv f16 --kv-layout paged
    ;;
ttft)
    # stop 33: time to first token (issue 8: a 512-token prompt, call to
    # sampled token): compute-sanitizer on the prefill kernels (quick test:
    # both kernels), the 512-token prefill's kernel profile, bench rows with
    # the default and the mma.sync prefill kernel.  Prebuilt only.
    prebuilt_stage ttft
    DEADLINE=${DEADLINE:-560}
    if command -v compute-sanitizer >/dev/null; then
        for tool in memcheck racecheck; do
            DSQ_ATTN_QUICK=1 timeout 200 compute-sanitizer --tool $tool "$B/tests/test_cuda_attention" \
                >"$OUT/san_$tool.log" 2>&1
            echo "== $tool rc=$? ($(el)) $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|prefill kernels" "$OUT/san_$tool.log" | tr '\n' ' ')"
        done
    fi
    wait $MODEL_PID
    export PYTHONUNBUFFERED=1
    DSQWEN_LIBRARY=$B/libdsqwen.so timeout 90 python3 tests/bench/kernel_profile.py --model $M \
        --json "$OUT/prof_512.json" --prefill 512 --steps 8 --warm 3 >"$OUT/prof_512.log" 2>&1
    echo "== prefill 512 profile rc=$?"; sed -n 1,24p "$OUT/prof_512.log"
    for rep in 1 2; do
        bench_row b1_512_r$rep 512 1 --kv f16
        DSQ_CUDA_PREFILL_WGMMA=0 bench_row mma_b1_512_r$rep 512 1 --kv f16
    done
    ;;
gu)
    # stop 33: a prompt's gate/up product in bf16 before SiLU*mul (default)
    # against fp32 (DSQ_CUDA_GU_F32=1): the kernel and GPU tests, time to
    # first token and the mixed step both ways, the 512-token prompt's
    # profile, then fullsize_check.py's accuracy part (HF fp32) both ways
    # (GU_FULL=0 skips it).  Prebuilt only.
    prebuilt_stage gu
    DEADLINE=${DEADLINE:-580}
    export DSQ_TEST_DATA=$PWD/tests/data
    for t in test_cuda_kernels test_cuda_e2e test_cuda_step_greedy test_cuda_seq_ops test_cuda_quant \
        test_cuda_quant_e2e test_cuda_nonfinite; do gtest $t; done
    grep -E "gemm-bf16|silu\*mul bf16" "$OUT/test_cuda_kernels.log" | head -6
    wait $MODEL_PID
    for rep in 1 2; do
        bench_row b1_512_r$rep 512 1 --kv f16
        DSQ_CUDA_GU_F32=1 bench_row f32_b1_512_r$rep 512 1 --kv f16
    done
    bench_row b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096 --sampling none
    DSQ_CUDA_GU_F32=1 bench_row f32_b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096 --sampling none
    mixed_row new $B
    mixed_row f32 $B DSQ_CUDA_GU_F32=1
    export PYTHONUNBUFFERED=1
    DSQWEN_LIBRARY=$B/libdsqwen.so timeout 90 python3 tests/bench/kernel_profile.py --model $M \
        --json "$OUT/prof_512.json" --prefill 512 --steps 8 --warm 3 >"$OUT/prof_512.log" 2>&1
    echo "== prefill 512 profile rc=$?"; sed -n '/^timeline/,$p' "$OUT/prof_512.log" | head -12
    if [ "${GU_FULL:-1}" = 1 ]; then
        for tag in new f32; do
            mkdir -p "$OUT/fs_$tag"
            env $([ $tag = f32 ] && echo DSQ_CUDA_GU_F32=1) timeout 170 python3 tests/fixtures/fullsize_check.py \
                --lib "$B/libdsqwen.so" --config tests/data/model/config.json --out "$OUT/fs_$tag" \
                --dir /tmp/dsq_fs_check >"$OUT/fullsize_$tag.log" 2>&1
            echo "== fullsize $tag rc=$? ($(el))"; grep -E "prefill err" "$OUT/fullsize_$tag.log"
        done
    fi
    ;;
kern)
    # test_cuda_kernels alone, its lines matching KERN_GREP (prebuilt)
    prebuilt || { echo "kern: needs .gpu/prebuilt.tar.xz"; exit 1; }
    gtest test_cuda_kernels
    grep -E "${KERN_GREP:-ERROR|FAIL}" "$OUT/test_cuda_kernels.log" | head -40
    ;;
ttft2)
    # stop 33: time to first token (three runs), the 4,096-token prompt in
    # one pass and the mixed step of the prebuilt tree, for a card the
    # targets table lacks them on.  Prebuilt only.
    prebuilt_stage ttft2
    wait $MODEL_PID
    for rep in 1 2 3; do bench_row b1_512_r$rep 512 1 --kv f16; done
    bench_row b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096
    mixed_row step $B
    ;;
attn)
    # test_cuda_attention alone (every case, both prefill kernels, the
    # timing rows); its prefill rows (prebuilt)
    prebuilt || { echo "attn: needs .gpu/prebuilt.tar.xz"; exit 1; }
    GTEST_TIMEOUT=200 gtest test_cuda_attention
    grep -E "prefill kernels tested|worst rel|FAIL|mismatched [1-9]" "$OUT/test_cuda_attention.log" | head -8
    grep -E "(f16|int8) +(wgmma|mma) +prefill (1 x|512 rows at +(0|1536|3584) .split plan|128 rows at +0 .split)" \
        "$OUT/test_cuda_attention.log"
    ;;
prompt2)
    # stop 32: the mixed step and the prefill profile of a base tree
    # (.gpu/base.tar.xz, an earlier prebuilt archive) against this one on
    # the same card; an nsys timeline of a 512-token prefill where nsys
    # exists (it did not on 2026-12-06's H100).  Prebuilt only.
    prebuilt_stage prompt2
    DEADLINE=${DEADLINE:-540}
    for t in test_cuda_e2e test_cuda_seq_ops test_cuda_step_greedy; do gtest $t; done
    base_tree
    wait $MODEL_PID
    mixed_row base /tmp/gs_base
    mixed_row new $B
    mixed_row new2 $B
    export PYTHONUNBUFFERED=1
    for tag in base new; do
        BB=$B; [ $tag = base ] && BB=/tmp/gs_base
        DSQWEN_LIBRARY=$BB/libdsqwen.so timeout 90 python3 tests/bench/kernel_profile.py --model $M \
            --json "$OUT/prof_$tag.json" --prefill 512 --steps 8 --warm 3 >"$OUT/prof_$tag.log" 2>&1
        echo "== prefill 512 profile, $tag rc=$?"; sed -n 2,14p "$OUT/prof_$tag.log"
    done
    DSQWEN_LIBRARY=$B/libdsqwen.so timeout 90 python3 tests/bench/kernel_profile.py --model $M \
        --json "$OUT/prof_mixed.json" --prefill 512 --batch 64 --context 1024 --steps 8 --warm 3 >"$OUT/prof_mixed.log" 2>&1
    echo "== mixed profile rc=$?"; sed -n 2,14p "$OUT/prof_mixed.log"
    if command -v nsys >/dev/null; then
        timeout 120 nsys profile -o "$OUT/pre512" --force-overwrite true -t cuda \
            "$B/examples/dsqwen" bench --model $M --prompt-len 512 --max-tokens 4 --batch 1 >"$OUT/nsys_run.log" 2>&1
        timeout 60 nsys stats -r cuda_api_sum,cuda_gpu_kern_sum "$OUT/pre512.nsys-rep" >"$OUT/nsys_stats.log" 2>&1
        echo "== nsys rc=$?"; head -40 "$OUT/nsys_stats.log"
    else
        echo "== no nsys"
    fi
    ;;
early)
    # stop 31: early PDL triggers (DSQ_CUDA_PDL_EARLY; pdl.cuh): the decode
    # merge kernel ("merge") and the GEMVs ("gemv") let their dependent
    # launch before their own wait, so the o_proj GEMV streams its weights
    # while batch-1 decode attention leaves the memory idle.  The default:
    # GEMVs, and merges of >= 128 splits.  Tests with "all", bench pairs
    # (default / none); EARLY_SWEEP=1 first sweeps every setting over the
    # context lengths.  Prebuilt only.
    prebuilt_stage early
    DEADLINE=${DEADLINE:-540}
    for t in test_cuda_e2e test_cuda_step_greedy test_cuda_seq_ops; do
        LOGSUFFIX=_all gtest $t DSQ_CUDA_PDL_EARLY=all
    done
    gtest test_cuda_e2e
    gtest test_cuda_quant_e2e
    bench_start
    sweep() { # name prompt batch args...: default (long), 0, merge, gemv, all
        local name=$1
        shift
        bench_row ${name}_d "$@"
        for v in 0 merge gemv all; do DSQ_CUDA_PDL_EARLY=$v bench_row ${name}_$v "$@"; done
    }
    if [ "${EARLY_SWEEP:-0}" = 1 ]; then
        sweep b1_512 512 1 --kv f16
        sweep b1_2048 2048 1 --kv f16
        sweep b1_4096 4096 1 --kv f16
        sweep b1_8192 8192 1 --kv f16
        sweep b1_512n 512 1 --kv f16 --sampling none
        sweep b1_32768p 32768 1 --kv f16 --kv-layout paged
        sweep b8_2048 2048 8 --kv f16
    fi
    # the default (GEMVs early, merges from 128 splits) against none, in pairs
    pair() { bench_row ${1}_d "${@:2}"; DSQ_CUDA_PDL_EARLY=0 bench_row ${1}_0 "${@:2}"; }
    # a 32,768-token context at 512 keys: the early merge is decided per
    # sequence (used splits), so the default must match none here, not "all"
    pair b1_512_ctx32k 512 1 --kv f16 --ctx 32768
    DSQ_CUDA_PDL_EARLY=all bench_row b1_512_ctx32k_all 512 1 --kv f16 --ctx 32768
    if [ "${EARLY_QUICK:-0}" = 1 ]; then # when device time is short: the deciding rows
        pair b1_512 512 1 --kv f16
        pair b1_8192 8192 1 --kv f16
        pair b64_1024 1024 64 --kv f16
    else
    for rep in 1 2; do
        pair b1_512_r$rep 512 1 --kv f16
        pair b1_8192_r$rep 8192 1 --kv f16
    done
    pair b1_512n 512 1 --kv f16 --sampling none
    pair b1_4096 4096 1 --kv f16
    pair b1_32768p 32768 1 --kv f16 --kv-layout paged
    pair b8_512 512 8 --kv f16
    pair b64_1024 1024 64 --kv f16
    pair b256_1024_int8 1024 256 --kv int8
    pair b1_512_q8h 512 1 --kv f16 --quantize int8 --quantize-head
    pair b1_512_q4 512 1 --kv f16 --quantize q4
    # fewer, longer splits at 8,192 keys (default: 129 splits of one tile)
    DSQ_CUDA_DECODE_SPLITS_MAX=64 bench_row b1_8192_s64 8192 1 --kv f16
    DSQ_CUDA_DECODE_SPLITS_MAX=32 bench_row b1_8192_s32 8192 1 --kv f16
    # where a long-context batch-1 step goes (attention's share at 8,192 keys)
    export PYTHONUNBUFFERED=1 DSQWEN_LIBRARY=$B/libdsqwen.so
    timeout 120 python3 tests/bench/kernel_profile.py --model $M --json "$OUT/b1_8192_s.json" \
        --batch 1 --context 8192 --sample >"$OUT/b1_8192_s.log" 2>&1
    echo "== kernel_profile b1 8192 sampled rc=$? ($(el))"
    grep -E "^wall" "$OUT/b1_8192_s.log"
    sed -n '/^timeline/,$p' "$OUT/b1_8192_s.log" | head -16
    fi
    ;;
sanitize)
    build test_cuda_e2e test_cuda_attention test_cuda_seq_ops
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_cuda_e2e" >"$OUT/memcheck.log" 2>&1
    echo "== memcheck e2e rc=$? ($(el))"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log"
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_cuda_seq_ops" >"$OUT/memcheck_seq.log" 2>&1
    echo "== memcheck seq_ops rc=$? ($(el))"; grep -E "ERROR SUMMARY" "$OUT/memcheck_seq.log"
    DSQ_ATTN_QUICK=1 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_cuda_attention" \
        >"$OUT/racecheck.log" 2>&1
    echo "== racecheck attention rc=$? ($(el))"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/racecheck.log"
    ;;
bench)
    build dsqwen dsqwen-cli bench_mixed_step
    fullsize_model
    CLI=$B/examples/dsqwen
    run() { bench_row "$@"; }
    bench_header
    # BENCH_QUICK=1: the batch-1/8/64 rows, the 4,096-token prefill and the
    # mixed step only (what a prefill or step change moves), ~3 minutes
    Q=${BENCH_QUICK:-0}
    run b1_512 512 1 --kv f16                     # issue 8: >= 1,100 tok/s
    run b1_512_none 512 1 --kv f16 --sampling none
    run b1_4096 4096 1 --kv f16                   # issue 8: prefill >= 130,000 (512-token chunks)
    run b1_4096_1pass 4096 1 --kv f16 --batch-tokens 4096 # the prompt in one pass
    [ "$Q" = 1 ] || run b1_8192 8192 1 --kv f16   # issue 8: >= 1,000
    [ "$Q" = 1 ] || run b1_32768 32768 1 --kv f16 --kv-layout paged # issue 8: >= 700
    run b8_512 512 8 --kv f16                     # issue 8: >= 6,000
    run b64_1024 1024 64 --kv f16                 # issue 7: >= 40,000
    run b64_1024_none 1024 64 --kv f16 --sampling none
    # gemm_rows.cu in place of cuBLASLt (DSQ_CUDA_GEMM_ROWS, off by default
    # until these rows beat the defaults above)
    DSQ_CUDA_GEMM_ROWS=64 run b64_1024_rows 1024 64 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 run b8_512_rows 512 8 --kv f16
    # ... and for every row count, ahead of the GEMVs (DSQ_CUDA_GEMM_ROWS_MIN)
    DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_GEMM_ROWS_MIN=1 run b1_512_rows1 512 1 --kv f16
    DSQ_CUDA_GEMM_ROWS=64 DSQ_CUDA_GEMM_ROWS_MIN=1 run b8_512_rows1 512 8 --kv f16
    # each layer's next weights prefetched into L2 while attention runs
    # (DSQ_CUDA_L2_PREFETCH=MB, off by default until these rows beat b1_512
    # / b8_512 / b1_8192)
    DSQ_CUDA_L2_PREFETCH=8 run b1_512_l2p8 512 1 --kv f16
    DSQ_CUDA_L2_PREFETCH=20 run b1_512_l2p20 512 1 --kv f16
    DSQ_CUDA_L2_PREFETCH=20 run b8_512_l2p20 512 8 --kv f16
    DSQ_CUDA_L2_PREFETCH=8 DSQ_CUDA_L2_PREFETCH_AT=all run b1_512_l2p8all 512 1 --kv f16
    DSQ_CUDA_L2_PREFETCH=16 DSQ_CUDA_L2_PREFETCH_AT=all run b1_512_l2p16all 512 1 --kv f16
    [ "$Q" = 1 ] || DSQ_CUDA_L2_PREFETCH=20 run b1_8192_l2p20 8192 1 --kv f16
    # gate/up and the head through the GEMVs at 8 rows (the tensor-core GEMV
    # with SiLU*mul fused; the 2-row crossover predates gemv_mma.cu)
    DSQ_CUDA_GEMV_MAX=8 run b8_512_gemv8 512 8 --kv f16
    [ "$Q" = 1 ] || run b256_1024_int8 1024 256 --kv int8         # issue 7: >= 80,000
    [ "$Q" = 1 ] || run b64_4096_f16 4096 64 --kv f16             # issue 7: INT8 >= 1.4x F16
    [ "$Q" = 1 ] || run b64_4096_int8 4096 64 --kv int8
    # issue 10 (quantized weights; BENCH_QUANT=1 runs them in the quick set
    # too): the GEMV / dequantize + cuBLASLt defaults, then the tensor-core
    # products of gemm_rows.cu (DSQ_CUDA_QROWS, off by default until these
    # rows beat the defaults)
    if { [ "$Q" != 1 ] || [ "${BENCH_QUANT:-0}" = 1 ]; } && $CLI help 2>&1 | grep -q quantize; then
        run b1_512_q8 512 1 --kv f16 --quantize int8 --quantize-head
        DSQ_CUDA_QROWS=64 run b1_512_q8_rows 512 1 --kv f16 --quantize int8 --quantize-head
        run b1_512_q4 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QROWS=64 run b1_512_q4_rows 512 1 --kv f16 --quantize q4
        DSQ_CUDA_QROWS=64 run b8_512_q4_rows 512 8 --kv f16 --quantize q4
        run b64_1024_q4 1024 64 --kv f16 --quantize q4
        DSQ_CUDA_QROWS=64 run b64_1024_q4_rows 1024 64 --kv f16 --quantize q4
    fi
    mixed_row step $B # issue 7: worst <= 2x plain
    ;;
serve)
    prebuilt && export SKIP_BUILD=1
    OUT=$OUT BUILD_DIR=$B bash scripts/bench_serve.sh
    ;;
profile)
    build dsqwen
    fullsize_model
    export PYTHONUNBUFFERED=1 DSQWEN_LIBRARY=$B/libdsqwen.so
    prof() { # name args...
        local name=$1
        shift
        timeout 90 python3 tests/bench/kernel_profile.py --model $M --json "$OUT/$name.json" "$@" \
            >"$OUT/$name.log" 2>&1
        echo "== $name rc=$? ($(el))"
        head -14 "$OUT/$name.log"
        sed -n '/^timeline/,$p' "$OUT/$name.log" | head -${TL_ROWS:-16}
    }
    # PROFILE=prefill: where a prompt's time goes (issues 7, 8, 13) instead;
    # PROFILE=sampled: sampled steps as dsqwen bench runs them (PDL on: the
    # timeline table charges each kernel only what it adds to the busy span)
    if [ "${PROFILE:-decode}" = sampled ]; then
        TL_ROWS=24 prof bf16_b1_512_s --batch 1 --context 512 --sample
        TL_ROWS=24 prof bf16_b64_1024_s --batch 64 --context 1024 --sample
        prof int8_b1_512_s --batch 1 --context 512 --quantize int8 --sample
    elif [ "${PROFILE:-decode}" = prefill ]; then
        prof prefill_512 --prefill 512 --steps 8 --warm 3
        prof prefill_4096 --prefill 4096 --steps 4 --warm 2
        prof mixed_63x1024_512 --prefill 512 --batch 64 --context 1024 --steps 8 --warm 3
        prof bf16_b64_1024 --batch 64 --context 1024
        prof prefill_128 --prefill 128 --steps 8 --warm 3
    else
        prof bf16_b1_512 --batch 1 --context 512
        prof q4_b1_512 --batch 1 --context 512 --quantize q4
        prof int8_b1_512 --batch 1 --context 512 --quantize int8
        prof bf16_b1_8192 --batch 1 --context 8192
        prof bf16_b8_512 --batch 8 --context 512
        prof q4_b64_1024 --batch 64 --context 1024 --quantize q4
    fi
    ;;
fuzz)
    # The targets that cannot reach 10M executions on a 2-core machine.
    # libFuzzer -jobs: each job is a separate process over one shared corpus;
    # the executions of all jobs are summed.  Needs clang with libFuzzer here,
    # or binaries built elsewhere and carried in .fuzzbin/ (same Debian libs
    # as .deps).
    FB=${FUZZ_BIN:-$ROOT/.fuzzbin}
    if [ -z "${FUZZ_BIN:-}" ] && command -v clang >/dev/null 2>&1; then
        cmake -S . -B /tmp/gs_fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSQ_FUZZ=ON \
            -DDSQ_CUDA=OFF -DDSQ_BUILD_EXAMPLES=OFF >"$OUT/build.log" 2>&1 &&
            cmake --build /tmp/gs_fuzz -j16 --target fuzz_tokenize fuzz_tokenize_regex fuzz_tokenizer fuzz_stopper \
                >>"$OUT/build.log" 2>&1 &&
            FB=/tmp/gs_fuzz/tests
    fi
    TARGETS=${FUZZ_TARGETS:-tokenize tokenize_regex}
    JOBS=${FUZZ_JOBS:-8}
    SECS=${FUZZ_SECONDS:-480}
    for t in $TARGETS; do
        # each job logs to fuzz-N.log in the working directory: one per target
        mkdir -p "$OUT/$t" "$OUT/art_$t" "$OUT/run_$t"
        cp tests/fuzz/corpus/$t/* "$OUT/$t/"
        extra=""
        [ $t = tokenize_regex ] && extra="-max_len=1024"
        [ $t = tokenizer ] && extra="-max_len=20000"
        (cd "$OUT/run_$t" && DSQ_FUZZ_TOKENIZER=$ROOT/tests/data/model/tokenizer.json \
            "$FB/fuzz_$t" -jobs=$JOBS -workers=$JOBS -max_total_time=$SECS -timeout=10 -rss_limit_mb=2048 \
            -malloc_limit_mb=1024 -print_final_stats=1 $extra -artifact_prefix="$OUT/art_$t/" "$OUT/$t" \
            >"$OUT/$t.log" 2>&1) &
    done
    wait
    echo "== fuzz ($JOBS jobs per target, $SECS s each) ($(el))"
    for t in $TARGETS; do
        total=$(grep -h "stat::number_of_executed_units" "$OUT/run_$t"/fuzz-*.log 2>/dev/null |
            awk '{s += $2} END {print s + 0}')
        rate=$(grep -h "stat::average_exec_per_sec" "$OUT/run_$t"/fuzz-*.log 2>/dev/null |
            awk '{s += $2} END {print s + 0}')
        echo "$t: executions $total (all jobs), exec/s $rate (all jobs), corpus $(ls "$OUT/$t" | wc -l)," \
             "artifacts $(ls "$OUT/art_$t" | wc -l): $(grep -lE "ERROR|deadly|leak" "$OUT/run_$t"/fuzz-*.log 2>/dev/null | wc -l) job logs with findings"
    done
    ;;
*)
    sed -n '2,50p' "$0"
    exit 2
    ;;
esac
fuzz_bg_end
echo "total $(el)"
if [ "${PACK:-1}" = 1 ]; then
    tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && rm -rf "$OUT" && echo "logs: $OUT.tgz"
fi
