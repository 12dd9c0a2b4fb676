#!/usr/bin/env bash
# The matched-bytes experiment (issue 6): eviction policies against quantized tiers, low rank and
# the seed papers' policies at the same byte budgets, offline (sweep) and live (verify), in both
# query-aware and query-agnostic modes, on real SmolLM2 requests (needle tasks and long text).
# Writes OUT/<mode>/{sweep,verify}.csv and OUT/table.md (analysis/matched_bytes.py), which answers
# the three seed claims from the measurements.
#   bench/matched_bytes.sh                 (after scripts/setup.sh; ~1 h on 2 cores)
#   NEEDLES=1 TEXTS=1 BUDGETS=0.25 bench/matched_bytes.sh   (a quick look)
#   POLICIES="kvzip;kvzip_proxy" TAG=_kvzip bench/matched_bytes.sh   (more policies into the same table:
#   results go to sweep$TAG.csv / verify$TAG.csv beside the others; the tasks are regenerated identically)
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
PYTHON=${PYTHON:-$HOME/.cache/kvsim/venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/matched_bytes}
MAX_NEW=${MAX_NEW:-32}
NEEDLES=${NEEDLES:-2}   # per needle kind (single, multikey, multivalue)
TEXTS=${TEXTS:-4}
BUDGETS=${BUDGETS:-0.1,0.2,0.25,0.5}
MODES=${MODES:-query-aware query-agnostic}
# Token selection | keep every token (quantized, low rank) | tiers and structure (seed ideas).
POLICIES=${POLICIES:-"streamingllm;snapkv;pyramidkv;adakv;h2o;expected_attention;keydiff;andpro;structure;kvzip;kvzip_proxy;intn:bits=4;intn:bits=2;kivi;lowrank;varrate;qevict;qevict:hi_share=1"}
TAG=${TAG:-}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
[ -f "$TEXT" ] || TEXT=docs/trace-format.md
mkdir -p "$OUT"

seed=11
: > "$OUT/tasks$TAG.jsonl"
for kind in single multikey multivalue; do
  "$KVSIM" tasks needle --kind "$kind" --count "$NEEDLES" --tokens 1200 --seed $((seed++)) -o "$OUT/$kind$TAG.jsonl" --force
  cat "$OUT/$kind$TAG.jsonl" >> "$OUT/tasks$TAG.jsonl"
done
"$KVSIM" tasks text --file "$TEXT" --count "$TEXTS" --tokens 1000 -o "$OUT/text$TAG.jsonl" --force
cat "$OUT/text$TAG.jsonl" >> "$OUT/tasks$TAG.jsonl"

# --repeat-pass: KVzip's reconstruction pass, for the kvzip policy.
"$KVSIM" capture -m "$MODEL" -r "$OUT/tasks$TAG.jsonl" -o "$OUT/trace$TAG.h5" --force --queries all --max-new "$MAX_NEW" \
  --repeat-pass
for mode in $MODES; do
  mkdir -p "$OUT/$mode"
  "$KVSIM" sweep "$OUT/trace$TAG.h5" -p "$POLICIES" -b "$BUDGETS" --mode "$mode" -o "$OUT/$mode/sweep$TAG.csv" --force -q \
    > "$OUT/$mode/sweep$TAG.txt"
  "$KVSIM" verify -m "$MODEL" -t "$OUT/tasks$TAG.jsonl" -p "$POLICIES" -b "$BUDGETS" --mode "$mode" --max-new "$MAX_NEW" \
    --offline "$OUT/$mode/sweep$TAG.csv" -o "$OUT/$mode/verify$TAG.csv" --agreement "$OUT/$mode/agreement$TAG.csv" \
    --force -q > "$OUT/$mode/verify$TAG.txt"
done
"$PYTHON" analysis/matched_bytes.py "$OUT" | tee "$OUT/table.md"
