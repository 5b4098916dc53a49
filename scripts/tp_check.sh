#!/usr/bin/env bash
# tp_check.sh - the tensor-parallel runs that need GPUs (issue 11), for
# nvidia-h200-x2 / -x4.  Written on a machine without GPUs: NOT YET RUN.
#
#   scripts/tp_check.sh build          configure + build (CUDA sm_90, NCCL ON)
#   scripts/tp_check.sh test           the TP ctests (+ mpirun tp_mpi if MPI)
#   scripts/tp_check.sh bench SHAPE    one shape's table rows: SHAPE in
#                                      1.5b 14b 32b 72b (72b: TP2/TP4 only)
#   scripts/tp_check.sh all            everything in order (longer than one
#                                      10-minute device call: prefer the stages)
#
# Results: $OUT (default ./tp_out): test logs, tp_results.tsv (one row per
# run: shape, world, batch, tok/s, ms/step, GB/GPU/token, % of the HBM
# floor) and tp_results.md (the table for docs/performance.md).
# Models: random-weight checkpoints of the real shapes written by
# scripts/tp_make_model.py into $TP_MODELS (default /dev/shm/dsq_tp_models,
# kept between calls while the machine is held; 72B is 145 GB: x2 has 256 GB
# of RAM, so other shapes are deleted first).  HBM: $HBM_TBS (default 4.8,
# H200) TB/s per GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/tp_out}
BUILD=${BUILD:-build-tp}
TP_MODELS=${TP_MODELS:-/dev/shm/dsq_tp_models}
HBM_TBS=${HBM_TBS:-4.8}
STEPS=${STEPS:-64}
mkdir -p "$OUT"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "tp_check: $NGPU GPU(s); out $OUT"

build() {
  cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DDSQ_NCCL=ON \
    >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
  local t="dsqwen test_cuda_tp test_cuda_nccl test_cpu_tp test_cuda_e2e test_cuda_step_greedy tp_local"
  grep -q 'tp_mpi (MPI) TRUE' "$OUT/configure.log" && t="$t tp_mpi"
  # shellcheck disable=SC2086 # the target list splits on purpose
  cmake --build "$BUILD" -j"$(nproc)" --target $t >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "build: ok ($t)"
}

tests() {
  (cd "$BUILD" && ctest --output-on-failure -R 'test_cuda_tp|test_cuda_nccl|test_cpu_tp|test_cuda_e2e|test_cuda_step_greedy' \
     2>&1 | tee "$OUT/ctest.log" | tail -15)
  "$BUILD/tests/test_cuda_tp" >"$OUT/test_cuda_tp.log" 2>&1 || true
  grep -E 'TP[0-9]|device 0 vs|lost peer|SKIP' "$OUT/test_cuda_tp.log" || true
  # one process per rank: the same ids as one process driving both GPUs
  if [ -x "$BUILD/examples/tp_mpi" ] && command -v mpirun >/dev/null && [ "$NGPU" -ge 2 ]; then
    mpirun --allow-run-as-root -np 2 "$BUILD/examples/tp_mpi" tests/data/tiny >"$OUT/tp_mpi.log" 2>&1 || true
    "$BUILD/examples/tp_local" tests/data/tiny 2 --steps 32 | head -1 >"$OUT/tp_local_ids.txt" || true
    if [ "$(head -1 "$OUT/tp_mpi.log")" = "$(cat "$OUT/tp_local_ids.txt")" ]; then
      echo "tp_mpi: ids equal tp_local's"; else echo "tp_mpi: DIFFERENT ids (see $OUT/tp_mpi.log)"; fi
  else
    echo "tp_mpi: not run (no MPI build, no mpirun or < 2 GPUs)"
  fi
}

# one benchmark run: shape world batch model_dir gb_weights
bench_one() {
  local shape=$1 world=$2 batch=$3 dir=$4 gb=$5
  local line
  line=$("$BUILD/examples/tp_local" "$dir" "$world" --steps "$STEPS" --batch "$batch" 2>"$OUT/bench_err.log" |
    grep '^tp_local:' || true)
  if [ -z "$line" ]; then
    echo "bench $shape world $world batch $batch: FAILED: $(tail -2 "$OUT/bench_err.log")"
    printf '%s\t%s\t%s\tFAILED\t\t\t\n' "$shape" "$world" "$batch" >>"$OUT/tp_results.tsv"
    return
  fi
  local tps ms
  tps=$(echo "$line" | sed -E 's/.*: ([0-9.]+) tok\/s.*/\1/')
  ms=$(echo "$line" | sed -E 's/.*\(([0-9.]+) ms\/step\).*/\1/')
  # floor: every GPU streams its share of the weights once per step
  local w=$(( world > 0 ? world : 1 ))
  python3 - "$shape" "$world" "$batch" "$tps" "$ms" "$gb" "$w" "$HBM_TBS" >>"$OUT/tp_results.tsv" <<'PY'
import sys
shape, world, batch, tps, ms, gb, w, hbm = sys.argv[1:]
per_gpu = float(gb) / int(w)
floor_ms = per_gpu / float(hbm)          # GB / (TB/s) = ms
print(f"{shape}\t{world}\t{batch}\t{float(tps):.1f}\t{float(ms):.3f}\t{per_gpu:.2f}\t{100 * floor_ms / float(ms):.0f}")
PY
  tail -1 "$OUT/tp_results.tsv"
}

bench() {
  local shape=$1 layers=${2:-0}
  local dir="$TP_MODELS/$shape"
  if [ "$shape" = 72b ]; then
    # make room: 145 GB
    for d in "$TP_MODELS"/*; do [ "$d" != "$dir" ] && rm -rf "$d"; done 2>/dev/null || true
  fi
  if [ ! -f "$dir/model.safetensors" ]; then
    python3 scripts/tp_make_model.py --shape "$shape" --out "$dir" ${layers:+--layers $layers}
  fi
  local gb
  gb=$(python3 -c "import os;print(os.path.getsize('$dir/model.safetensors')/1e9)")
  [ -f "$OUT/tp_results.tsv" ] || printf 'shape\tworld\tbatch\ttok/s\tms/step\tGB/GPU/step\t%%floor\n' >"$OUT/tp_results.tsv"
  case $shape in
    72b)
      for w in 2 4; do
        [ "$NGPU" -ge "$w" ] || { echo "72b TP$w: skipped ($NGPU GPUs)"; continue; }
        for b in 1 64; do bench_one 72b $w $b "$dir" "$gb"; done
      done ;;
    *)
      bench_one "$shape" 0 1 "$dir" "$gb"     # one GPU, plain path
      bench_one "$shape" 1 1 "$dir" "$gb"     # one rank through NCCL
      for w in 2 4; do
        [ "$NGPU" -ge "$w" ] && bench_one "$shape" $w 1 "$dir" "$gb"
      done ;;
  esac
}

table() {
  [ -f "$OUT/tp_results.tsv" ] || return 0
  python3 - "$OUT/tp_results.tsv" >"$OUT/tp_results.md" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1]), delimiter="\t"))[1:]
base = {(r[0], r[2]): float(r[3]) for r in rows if r[1] == "0" and r[3] != "FAILED"}
print("| shape | GPUs (TP) | batch | tok/s | ms/step | GB/GPU/step | % of HBM floor | vs one GPU |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    tp = "1 (plain)" if r[1] == "0" else f"{r[1]} (TP{r[1]})"
    sp = ""
    if r[3] != "FAILED" and (r[0], r[2]) in base and r[1] != "0":
        sp = f"{float(r[3]) / base[(r[0], r[2])]:.2f}x"
    print(f"| {r[0]} | {tp} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {sp} |")
PY
  cat "$OUT/tp_results.md"
}

case ${1:-all} in
  build) build ;;
  test) tests ;;
  bench) bench "${2:?shape: 1.5b 14b 32b 72b}" "${3:-}"; table ;;
  table) table ;;
  all) build; tests; for s in 1.5b 14b 32b 72b; do bench $s; done; table ;;
  *) echo "usage: $0 build|test|bench SHAPE [LAYERS]|table|all" >&2; exit 2 ;;
esac
