#!/usr/bin/env bash
# The agreement experiment (issues 5, 24): does the offline sweep rank (policy, budget) configs the
# way the live model does, on requests nothing was fitted on? SmolLM2 requests (RULER-style needle
# tasks of ~1.2K tokens and long-text windows) are captured once and split: every third request
# calibrates the offline estimate (`kvsim calibrate` fits its layer weights to live runs), the rest
# are held out. Per mode: sweep every request offline, verify the calibration split live, calibrate,
# verify the held-out split live and print its agreement table; then the sweep and live wall times
# per (request, config), side by side.
#   bench/verify_agreement.sh                     (after scripts/setup.sh; ~1 h on 2 cores)
#   NEEDLES=1 TEXTS=2 BUDGETS=0.2 MODES=query-aware bench/verify_agreement.sh   (a quick look)
# The policies span token selection, quantized tiers and low rank, so the run also feeds the
# matched-bytes table (analysis/matched_bytes.py OUT reads sweep.csv and verify*.csv per mode).
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/agreement}
MODES=${MODES:-query-aware query-agnostic}
MAX_NEW=${MAX_NEW:-32}
NEEDLES=${NEEDLES:-2}   # per needle kind (single, multikey, multivalue, vartrack)
TEXTS=${TEXTS:-4}
NEEDLE_TOKENS=${NEEDLE_TOKENS:-1200}  # prompt lengths: Gemma 3 needs longer ones (its windows)
TEXT_TOKENS=${TEXT_TOKENS:-1000}
POLICIES=${POLICIES:-"streamingllm;snapkv;pyramidkv;adakv;h2o;tova;expected_attention;keydiff;andpro;andpro:sign=clamp;andpro:sign=abs;kvzip;intn:bits=4;intn:bits=2;kivi;lowrank;varrate;qevict"}
BUDGETS=${BUDGETS:-0.1,0.2,0.25,0.5}
SEMANTICS=${SEMANTICS:-point}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
[ -f "$TEXT" ] || TEXT=docs/trace-format.md
mkdir -p "$OUT"

seed=11
: > "$OUT/tasks.jsonl"
for kind in single multikey multivalue vartrack; do
  "$KVSIM" tasks needle --kind "$kind" --count "$NEEDLES" --tokens "$NEEDLE_TOKENS" --seed $((seed++)) -o "$OUT/$kind.jsonl" --force
  cat "$OUT/$kind.jsonl" >> "$OUT/tasks.jsonl"
done
"$KVSIM" tasks text --file "$TEXT" --count "$TEXTS" --tokens "$TEXT_TOKENS" -o "$OUT/text.jsonl" --force
cat "$OUT/text.jsonl" >> "$OUT/tasks.jsonl"
# The split, by line: 1, 4, 7, ... calibrate; the rest are held out.
awk 'NR % 3 == 1' "$OUT/tasks.jsonl" > "$OUT/calibration.jsonl"
awk 'NR % 3 != 1' "$OUT/tasks.jsonl" > "$OUT/heldout.jsonl"

now() { date +%s.%N; }
repeat=()
[[ "$POLICIES" == *kvzip* ]] && repeat=(--repeat-pass)  # KVzip's reconstruction pass
if [ "${REUSE_LIVE:-0}" = 1 ] && [ -f "$OUT/trace.h5" ]; then
  echo "(reusing $OUT/trace.h5)"
else
  "$KVSIM" capture -m "$MODEL" -r "$OUT/tasks.jsonl" -o "$OUT/trace.h5" --force --queries all --max-new "$MAX_NEW" \
    "${repeat[@]}"
fi
configs=$(( $(tr ';' '\n' <<< "$POLICIES" | grep -c .) * $(tr ',' '\n' <<< "$BUDGETS" | grep -c .) ))
# live MODE SPLIT: verify one split live, its wall time beside the CSV. REUSE_LIVE=1 keeps the
# trace and the live CSVs an earlier run of the same tasks left (their wall times with them).
live() {
  local d="$OUT/$1" split=$2
  if [ "${REUSE_LIVE:-0}" = 1 ] && [ -f "$d/verify_$split.csv" ] && [ -f "$d/verify_$split.wall" ]; then
    echo "(reusing $d/verify_$split.csv)"; return
  fi
  local t0; t0=$(now)
  "$KVSIM" verify -m "$MODEL" -t "$OUT/$split.jsonl" -p "$POLICIES" -b "$BUDGETS" --mode "$1" \
    --budget-semantics "$SEMANTICS" --max-new "$MAX_NEW" -o "$d/verify_$split.csv" --force -q > "$d/verify_$split.txt"
  awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.3f\n", b - a }' > "$d/verify_$split.wall"
}
for mode in $MODES; do
  d="$OUT/$mode"
  mkdir -p "$d"
  t0=$(now)
  "$KVSIM" sweep "$OUT/trace.h5" -p "$POLICIES" -b "$BUDGETS" --mode "$mode" --budget-semantics "$SEMANTICS" \
    -o "$d/sweep.csv" --detail "$d/sweep.jsonl" --force -q > "$d/sweep.txt"
  t1=$(now)
  live "$mode" calibration
  live "$mode" heldout
  "$KVSIM" calibrate --offline "$d/sweep.csv" --detail "$d/sweep.jsonl" --live "$d/verify_calibration.csv" \
    -o "$d/estimator.json" --force | tee "$d/calibrate.txt"
  echo "== $mode: agreement on the $(wc -l < "$OUT/heldout.jsonl") held-out requests (the estimator was fitted on" \
    "the other $(wc -l < "$OUT/calibration.jsonl") of $(wc -l < "$OUT/tasks.jsonl"))"
  "$KVSIM" agreement --offline "$d/sweep.csv" --detail "$d/sweep.jsonl" --estimator "$d/estimator.json" \
    --live "$d/verify_heldout.csv" -o "$d/agreement.csv" --force | tee "$d/agreement.txt"
  awk -v a="$t0" -v b="$t1" -v n="$(wc -l < "$OUT/tasks.jsonl")" -v k="$configs" \
    -v lc="$(cat "$d/verify_calibration.wall")" -v lh="$(cat "$d/verify_heldout.wall")" 'BEGIN {
    sweep = b - a; live = lc + lh
    printf "%d requests x %d configs: offline sweep %.1f s | live verify %.1f s | live / offline = %.1fx\n",
      n, k, sweep, live, live / sweep }' | tee "$d/timing.txt"
done
# The figures: frontiers, heatmaps, offline vs live (docs/reports.md).
inputs=()
for mode in $MODES; do
  inputs+=("$OUT/$mode/sweep.csv" "$OUT/$mode/sweep.jsonl" "$OUT/$mode/verify_heldout.csv" "$OUT/$mode/agreement.csv")
done
"$KVSIM" report "${inputs[@]}" -o "$OUT/report.html" --force
