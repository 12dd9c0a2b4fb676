#!/usr/bin/env bash
# The matched-bytes experiment (issues 6, 24): eviction policies against quantized tiers, low rank
# and the seed papers' policies at the same byte budgets, offline (sweep) and live (verify), in
# both modes, under both budget semantics (point: bytes matched at the compression point; peak:
# held at every step, docs/budget_semantics.md). Each semantics is one run of
# bench/verify_agreement.sh (its held-out agreement comes with it) plus QEvict's keep/drop
# ablation; analysis/matched_bytes.py then writes OUT/<semantics>/table.md with the three seed
# claims judged from the measurements.
#   bench/matched_bytes.sh                              (after scripts/setup.sh; ~2 h on 2 cores)
#   SEMANTICS_LIST=peak NEEDLES=1 TEXTS=2 bench/matched_bytes.sh   (a smaller look at one semantics)
#   REUSE_LIVE=1 ...: keep live results an earlier run of the same tasks left (verify_agreement.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
PYTHON=${PYTHON:-$HOME/.cache/kvsim/venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/matched_bytes}
MODES=${MODES:-query-aware query-agnostic}
MAX_NEW=${MAX_NEW:-32}
BUDGETS=${BUDGETS:-0.1,0.2,0.25,0.5}
SEMANTICS_LIST=${SEMANTICS_LIST:-point peak}
# Token selection | keep every token (quantized, low rank) | tiers. Peak semantics refuses KVzip
# (its reconstruction pass cannot be re-run as tokens arrive), so it is left out there, and
# QEvict re-tiers every 32 tokens (its default 128 outgrows half the smallest budget).
POINT_POLICIES="streamingllm;snapkv;pyramidkv;adakv;h2o;tova;expected_attention;keydiff;andpro;andpro:sign=clamp;andpro:sign=abs;kvzip;intn:bits=4;intn:bits=2;kivi;lowrank;varrate;qevict"
PEAK_POLICIES="${POINT_POLICIES/;kvzip;/;}"
PEAK_POLICIES="${PEAK_POLICIES/%;qevict/;qevict:retier=32}"
export KVSIM MODEL MODES MAX_NEW BUDGETS
for semantics in $SEMANTICS_LIST; do
  dir="$OUT/$semantics"
  policies=$POINT_POLICIES ablation=${ABLATION:-qevict:hi_share=1}  # QEvict, middle tier off: keep/drop
  [ "$semantics" = peak ] && policies=$PEAK_POLICIES ablation=${ABLATION:-qevict:hi_share=1,retier=32}
  OUT="$dir" SEMANTICS="$semantics" POLICIES="${POLICIES:-$policies}" bench/verify_agreement.sh
  for mode in $MODES; do
    d="$dir/$mode"
    if [ "${REUSE_LIVE:-0}" = 1 ] && [ -f "$d/verify_ablation.csv" ]; then continue; fi
    "$KVSIM" sweep "$dir/trace.h5" -p "$ablation" -b "$BUDGETS" --mode "$mode" --budget-semantics "$semantics" \
      -o "$d/sweep_ablation.csv" --force -q > /dev/null
    "$KVSIM" verify -m "$MODEL" -t "$dir/tasks.jsonl" -p "$ablation" -b "$BUDGETS" --mode "$mode" \
      --budget-semantics "$semantics" --max-new "$MAX_NEW" -o "$d/verify_ablation.csv" --force -q > /dev/null
  done
  "$PYTHON" analysis/matched_bytes.py "$dir" | tee "$dir/table.md"
done
