#!/usr/bin/env bash
# Long libFuzzer runs, one target at a time, for the figures recorded in
# tests/fuzz/README.md.  Usage (from the repository root, after building the
# targets as the README says):
#
#   tests/fuzz/campaign.sh OUTDIR name:runs:max_seconds ...
#
# e.g. tests/fuzz/campaign.sh /tmp/fz chat:10000000:900 index:0:600
# (runs 0 = no run limit).  Each target fuzzes a scratch copy of its seed
# corpus under OUTDIR/<name>, at nice 10; OUTDIR/summary.txt gets one line
# per target: executions, exec/s, seconds, exit status, and any crash file.
set -uo pipefail
out=$1
shift
mkdir -p "$out"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib include tests/fuzz || echo '+changes')"
  echo "# $(nproc) cores, $(clang --version | head -n1)"
} >>"$out/summary.txt"
for spec in "$@"; do
  IFS=: read -r name runs secs <<<"$spec"
  rm -rf "${out:?}/$name"
  mkdir -p "$out/$name" "$out/artifacts_$name"
  cp tests/fuzz/corpus/"$name"/* "$out/$name/"
  extra=""
  [ "$name" = tokenizer ] && extra="-max_len=20000"
  [ "$name" = tokenize_regex ] && extra="-max_len=1024"
  t0=$(date +%s)
  [ "$runs" = 0 ] && runs=-1 # libFuzzer: -1 = no limit
  nice -n 10 build-fuzz/tests/fuzz_"$name" -runs="$runs" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 $extra \
    -artifact_prefix="$out/artifacts_$name/" "$out/$name" >"$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  ex=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$name.log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/$name.log")
  crash=$(ls "$out/artifacts_$name" 2>/dev/null | tr '\n' ' ')
  echo "$name execs=${ex:-?} exec_per_s=${rate:-?} seconds=$((t1 - t0)) rc=$rc" \
       "start=$(date -u -d @"$t0" +%H:%M:%S) corpus=$(ls "$out/$name" | wc -l) artifacts=${crash:-none}" \
       >>"$out/summary.txt"
done
