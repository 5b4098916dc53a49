#!/usr/bin/env bash
# bench_serve.sh - the issue-13 load test of `dsqwen serve` on the H200, in
# one go: build (CUDA, sm_90) with libmicrohttpd, a random-weight model of
# the exact 1.5B shape (seeded, as scripts/bench_sampling.sh makes it), the
# reference `dsqwen bench` at batch 64 with 512-token prompts and 256
# decode steps (FP16 paged KV, sampling in the library), then the server
# with 64 sequences and scripts/bench_serve.py: 64 concurrent streaming
# clients, 512-token prompts, 256-token outputs (one warm-up wave, one
# measured).  Prints output tok/s, p50/p99 TTFT and inter-token latency and
# the issue's targets (>= 85% of the bench's tok/s, p99 inter-token <= 2x
# its ms/step); figures go to docs/performance.md by hand.
#
# Run from the repository root on the GPU machine.  It has no network: make
# .deps/ first with scripts/fetch_device_deps.sh (it downloads libmicrohttpd
# too) and carry it; this script sources scripts/device_env.sh when .deps/
# is there.  Logs in $OUT (default /tmp/bench_serve).
set -u
OUT=${OUT:-/tmp/bench_serve}
B=${BUILD_DIR:-/tmp/bserve}
CLIENTS=${CLIENTS:-64}
PROMPT=${PROMPT:-512}
GEN=${GEN:-256}
KV=${KV:-f16}
PORT=${PORT:-18080}
BATCH_TOKENS=${BATCH_TOKENS:-384}   # the server's --batch-tokens (tokens per step; its default)
PREFILL_CHUNK=${PREFILL_CHUNK:-256} # and --prefill-chunk
mkdir -p "$OUT"
ROOT=$(pwd)
[ -d .deps ] && source scripts/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
# SKIP_BUILD=1: use $B/examples/dsqwen as it is (built elsewhere and carried)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
cmake -S . -B $B -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DDSQ_CUDA=ON \
  -DDSQ_BUILD_TESTS=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 --target dsqwen-cli >>"$OUT/build.log" 2>&1
rc=$?
echo "== build rc=$rc ($(( $(date +%s) - t0 )) s)"
if [ $rc != 0 ]; then grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; fi
grep -i "serve" "$OUT/build.log" | head -2
fi
CLI=$B/examples/dsqwen
VER=$($CLI --version 2>&1) || { echo "$CLI does not run: $VER"; exit 1; }
echo "$VER" | grep -q "serve: yes" || { echo "dsqwen built without serve (libmicrohttpd?)"; exit 1; }

M=/tmp/dsq_fullsize
if [ ! -f $M/model.safetensors ]; then
timeout 300 python3 - <<PY >"$OUT/model.log" 2>&1
import sys, shutil
sys.path.insert(0, "$ROOT/tests/fixtures")
from fullsize_check import build_model
build_model("$ROOT/tests/data/model/config.json", "$M", 20240601)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy("$ROOT/tests/data/model/" + f, "$M/" + f)
print("model ready")
PY
echo "== model rc=$? ($(tail -1 $OUT/model.log))"
fi
# a model made by tests/fixtures/fullsize_check.py (the same seed) lacks them
for f in tokenizer.json tokenizer_config.json generation_config.json; do
  [ -f $M/$f ] || cp tests/data/model/$f $M/
done

# the reference: the same batch, context and sampling through `dsqwen bench`
timeout 300 $CLI bench --model $M --batch $CLIENTS --prompt-len $PROMPT --max-tokens $GEN \
  --kv $KV --kv-layout paged >"$OUT/bench.log" 2>&1
echo "== dsqwen bench rc=$?"; grep -vE "^\s*$" "$OUT/bench.log" | tail -3
# columns: batch prompt prefill_t/s prefill_ms steps ms/step decode_t/s step0_ms floor% e2e_t/s
read -r BENCH_MS BENCH_TPS BENCH_E2E < <(awk -v b=$CLIENTS '$1 == b && $2 ~ /^[0-9]+$/ {print $6, $7, $10}' "$OUT/bench.log")
echo "bench: ${BENCH_TPS:-?} tok/s, ${BENCH_MS:-?} ms/step, ${BENCH_E2E:-?} tok/s with the prefill"

CTX=$(( PROMPT + GEN + 16 ))
start_server() { # LOG extra-args...: sets SPID once it listens
  local log=$1
  shift
  $CLI serve --model $M --port $PORT --max-seqs $CLIENTS --ctx $CTX --kv $KV \
    --batch-tokens $BATCH_TOKENS --prefill-chunk $PREFILL_CHUNK "$@" >"$log" 2>&1 &
  SPID=$!
  for i in $(seq 300); do
    grep -q "listening on" "$log" && break
    kill -0 $SPID 2>/dev/null || break
    sleep 0.5
  done
}
start_server "$OUT/serve.log"
grep "dsqwen serve" "$OUT/serve.log" | head -3
args=(--url http://127.0.0.1:$PORT --clients $CLIENTS --prompt-len $PROMPT --max-tokens $GEN
      --waves 2 --processes 16 --json "$OUT/serve.json")
[ -n "${BENCH_TPS:-}" ] && args+=(--bench-tok-s $BENCH_TPS --bench-ms-step $BENCH_MS)
[ -n "${BENCH_E2E:-}" ] && args+=(--bench-e2e-tok-s $BENCH_E2E)
# time inside dsq_step and the scheduler's own work per step, from
# /metrics, as the difference over one run (the counters are cumulative)
snap() {
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" |
    awk '/^dsqwen_(step|host)_seconds_(sum|count) / {printf "%s=%s ", $1, $2}'
}
split_times() { # before after
  python3 - "$1" "$2" <<'PY'
import sys
a, b = (dict(kv.split("=") for kv in x.split()) for x in sys.argv[1:3])
d = {k: float(b[k]) - float(a.get(k, 0)) for k in b}
n = d.get("dsqwen_step_seconds_count", 0)
if n:
    print(f"per step over {n:.0f} steps: {1e3 * d['dsqwen_step_seconds_sum'] / n:.3f} ms inside dsq_step, "
          f"{1e3 * d['dsqwen_host_seconds_sum'] / n:.3f} ms of scheduler work")
PY
}
m0=$(snap)
timeout 900 python3 scripts/bench_serve.py "${args[@]}" 2>&1 | tee "$OUT/client.log"
echo "== bench_serve rc=${PIPESTATUS[0]}"
m1=$(snap); split_times "$m0" "$m1"
# the same load with a 256-token prefix shared by every prompt (prefix cache;
# SKIP_PREFIX=1 leaves it out)
if [ "${SKIP_PREFIX:-0}" != 1 ]; then
timeout 900 python3 scripts/bench_serve.py "${args[@]}" --shared-prefix 256 \
  --json "$OUT/serve_prefix.json" 2>&1 | tee "$OUT/client_prefix.log"
fi
m2=$(snap); split_times "$m1" "$m2"
# plain streaming clients, as most OpenAI users are: no logprobs, so the
# per-token chunks take the server's direct formatting path
timeout 900 python3 scripts/bench_serve.py "${args[@]}" --no-logprobs \
  --json "$OUT/serve_nolp.json" 2>&1 | tee "$OUT/client_nolp.log"
m3=$(snap); split_times "$m2" "$m3"
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
  >"$OUT/metrics_overlap.txt" 2>/dev/null
kill -TERM $SPID; wait $SPID; echo "== server exit $?"
[ "${SKIP_NOOVERLAP:-0}" = 1 ] && { echo "total $(( $(date +%s) - t0 )) s"; exit 0; }
# the same plain load with the output work between steps (--no-overlap),
# to see what the output worker buys
start_server "$OUT/serve_nooverlap.log" --no-overlap
m4=$(snap)
timeout 900 python3 scripts/bench_serve.py "${args[@]}" --no-logprobs \
  --json "$OUT/serve_nooverlap.json" 2>&1 | tee "$OUT/client_nooverlap.log"
m5=$(snap); split_times "$m4" "$m5"
curl -s http://127.0.0.1:$PORT/metrics >"$OUT/metrics.txt" 2>/dev/null ||
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" >"$OUT/metrics.txt"
grep -E "^dsqwen_(generation_tokens_total|prefix_cache_hit_tokens_total|steps_total|requests_total)" "$OUT/metrics.txt"
kill -TERM $SPID; wait $SPID; echo "== server exit $?"
echo "total $(( $(date +%s) - t0 )) s"
