#!/usr/bin/env bash
# The agreement experiment (issue 5): does the offline sweep rank (policy, budget) configs the way
# the live model does? Generates ~20 SmolLM2 requests (RULER-style needle tasks of ~1.2K tokens and
# long-text windows), captures them, sweeps 9 policies x 4 budgets offline, verifies every config
# live on the really compressed cache, and prints the agreement table and the two wall times.
#   bench/verify_agreement.sh            (after scripts/setup.sh; OUT=dir MODE=query-agnostic to vary)
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/agreement}
MODE=${MODE:-query-aware}
MAX_NEW=${MAX_NEW:-32}
POLICIES=${POLICIES:-streamingllm,snapkv,pyramidkv,adakv,h2o,tova,keydiff,expected_attention,random}
BUDGETS=${BUDGETS:-0.1,0.2,0.3,0.5}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
[ -f "$TEXT" ] || TEXT=docs/trace-format.md
mkdir -p "$OUT"

seed=1
: > "$OUT/tasks.jsonl"
for kind in single multikey multivalue vartrack; do
  "$KVSIM" tasks needle --kind "$kind" --count 3 --tokens 1200 --seed $((seed++)) -o "$OUT/$kind.jsonl" --force
  cat "$OUT/$kind.jsonl" >> "$OUT/tasks.jsonl"
done
"$KVSIM" tasks text --file "$TEXT" --count 8 --tokens 1000 -o "$OUT/text.jsonl" --force
cat "$OUT/text.jsonl" >> "$OUT/tasks.jsonl"

now() { date +%s.%N; }
t0=$(now)
"$KVSIM" capture -m "$MODEL" -r "$OUT/tasks.jsonl" -o "$OUT/trace.h5" --force --queries all --max-new "$MAX_NEW"
t1=$(now)
"$KVSIM" sweep "$OUT/trace.h5" -p "$POLICIES" -b "$BUDGETS" --mode "$MODE" -o "$OUT/sweep.csv" \
  --detail "$OUT/sweep.jsonl" --force -q > "$OUT/sweep.txt"
t2=$(now)
"$KVSIM" verify -m "$MODEL" -t "$OUT/tasks.jsonl" -p "$POLICIES" -b "$BUDGETS" --mode "$MODE" --max-new "$MAX_NEW" \
  --offline "$OUT/sweep.csv" --detail "$OUT/sweep.jsonl" -o "$OUT/verify.csv" --agreement "$OUT/agreement.csv" \
  --force -q | tee "$OUT/verify.txt"
t3=$(now)
awk -v c="$t0" -v s="$t1" -v v="$t2" -v e="$t3" 'BEGIN {
  printf "\ncapture %.1f s | offline sweep %.1f s | live verify %.1f s | live / offline = %.1fx\n", s - c, v - s, e - v, (e - v) / (v - s) }' \
  | tee -a "$OUT/verify.txt"
