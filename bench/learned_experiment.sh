#!/usr/bin/env bash
# The learned-policy experiment (issue 25, docs/experiments/learned.md): learned policies against
# the heuristics and oracle_golden on SmolLM2 requests they were not trained on. Training requests
# (needle tasks of the four kinds + long-text windows) and held-out requests come from different
# seeds and text offsets. Per mode: train foresight, sigmoid_gate, distillcache (trace reward,
# warm-started from foresight; with LIVE_RL=1 also live reward) and rlkv on the training trace,
# sweep the held-out trace offline, verify it live, and print both summaries.
#   bench/learned_experiment.sh                                   (after scripts/setup.sh; ~30 min)
#   TRAIN_NEEDLES=2 HELD_NEEDLES=1 MODES=query-aware bench/learned_experiment.sh   (a quick look)
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/learned}
MODES=${MODES:-query-aware query-agnostic}
MAX_NEW=${MAX_NEW:-24}
TOKENS=${TOKENS:-1000}
TRAIN_NEEDLES=${TRAIN_NEEDLES:-9}   # per needle kind, + TRAIN_TEXTS text windows
TRAIN_TEXTS=${TRAIN_TEXTS:-8}
HELD_NEEDLES=${HELD_NEEDLES:-4}
HELD_TEXTS=${HELD_TEXTS:-4}
BUDGETS=${BUDGETS:-0.1,0.25,0.5}
STEPS=${STEPS:-600}
EPISODES=${EPISODES:-150}
LIVE_EPISODES=${LIVE_EPISODES:-60}
BASELINES=${BASELINES:-"h2o;snapkv;adakv;tova;keydiff;oracle_golden"}
mkdir -p "$OUT"
# Text windows are consecutive, so the two splits take different windows of one long text.
TEXT=${TEXT:-$OUT/licenses.txt}
if [ ! -f "$TEXT" ]; then
  cat /usr/share/common-licenses/{GPL-3,LGPL-2.1,GPL-2,MPL-2.0,Apache-2.0} > "$TEXT" 2>/dev/null || cat docs/*.md > "$TEXT"
fi

tasks() {  # SPLIT NEEDLES SEED: needle tasks of every kind, ids prefixed with the split
  local split=$1 needles=$2 seed=$3
  : > "$OUT/$split.jsonl"
  for kind in single multikey multivalue vartrack; do
    "$KVSIM" tasks needle --kind "$kind" --count "$needles" --tokens "$TOKENS" --seed $((seed++)) -o "$OUT/$split-$kind.jsonl" --force
    sed "s/\"id\":\"/\"id\":\"$split-/" "$OUT/$split-$kind.jsonl" >> "$OUT/$split.jsonl"
  done
}
if [ "${REUSE:-0}" = 1 ] && [ -f "$OUT/train.h5" ] && [ -f "$OUT/heldout.h5" ]; then
  echo "(reusing $OUT/train.h5 and $OUT/heldout.h5)"
else
  tasks train "$TRAIN_NEEDLES" 101
  tasks heldout "$HELD_NEEDLES" 201
  "$KVSIM" tasks text --file "$TEXT" --count $((TRAIN_TEXTS + HELD_TEXTS)) --tokens "$TOKENS" -o "$OUT/text.jsonl" --force
  head -n "$TRAIN_TEXTS" "$OUT/text.jsonl" | sed 's/"id":"/"id":"train-/' >> "$OUT/train.jsonl"
  tail -n +"$((TRAIN_TEXTS + 1))" "$OUT/text.jsonl" | sed 's/"id":"/"id":"heldout-/' >> "$OUT/heldout.jsonl"
  # Features read at most the last 128 queries: record those (and the question and answer) in
  # training; the held-out trace records every query, which H2O's score needs.
  "$KVSIM" capture -m "$MODEL" -r "$OUT/train.jsonl" -o "$OUT/train.h5" --force --queries eval --query-window 128 \
    --max-new "$MAX_NEW"
  "$KVSIM" capture -m "$MODEL" -r "$OUT/heldout.jsonl" -o "$OUT/heldout.h5" --force --queries all --max-new "$MAX_NEW"
fi
echo "train: $(wc -l < "$OUT/train.jsonl") requests; held out: $(wc -l < "$OUT/heldout.jsonl")"

for mode in $MODES; do
  d="$OUT/$mode"
  mkdir -p "$d"
  train() {  # METHOD OUT [options]: train one method, its log beside the model
    local method=$1 model=$2; shift 2
    "$KVSIM" train "$method" "$OUT/train.h5" --mode "$mode" -o "$model" --force "$@" 2>&1 |
      tee "${model%.h5}.txt" | grep -v "^train: reading"
  }
  train foresight "$d/foresight.h5" --steps "$STEPS"
  # The live soft-to-hard gap runs on the training trace's held-out fifth, whose tasks are in train.jsonl.
  train sigmoid_gate "$d/sigmoid_gate.h5" --steps "$STEPS" -m "$MODEL" -t "$OUT/train.jsonl" --max-new "$MAX_NEW"
  train distillcache "$d/distillcache.h5" --episodes "$EPISODES" --init "$d/foresight.h5"
  train rlkv "$d/rlkv.h5"
  policies="foresight:model=$d/foresight.h5;sigmoid_gate:model=$d/sigmoid_gate.h5;distillcache:model=$d/distillcache.h5"
  policies="$policies;rlkv:model=$d/rlkv.h5"
  if [ "${LIVE_RL:-0}" = 1 ]; then
    train distillcache "$d/distillcache_live.h5" --episodes "$LIVE_EPISODES" --init "$d/foresight.h5" --reward live \
      -m "$MODEL" -t "$OUT/train.jsonl" --max-new "$MAX_NEW"
    policies="$policies;distillcache:model=$d/distillcache_live.h5"
  fi
  policies="$policies;$BASELINES"
  "$KVSIM" sweep "$OUT/heldout.h5" -p "$policies" -b "$BUDGETS" --mode "$mode" -o "$d/sweep.csv" --force -q |
    tee "$d/sweep.txt"
  "$KVSIM" verify -m "$MODEL" -t "$OUT/heldout.jsonl" -p "${policies//;oracle_golden/}" -b "$BUDGETS" --mode "$mode" \
    --max-new "$MAX_NEW" --offline "$d/sweep.csv" -o "$d/verify.csv" --force -q | tee "$d/verify.txt"
done
# The figures: frontiers, offline vs live, every model's training curve (docs/reports.md).
inputs=()
for mode in $MODES; do
  inputs+=("$OUT/$mode/sweep.csv" "$OUT/$mode/verify.csv")
  for m in "$OUT/$mode"/*.h5; do inputs+=("$m"); done
done
"$KVSIM" report "${inputs[@]}" -o "$OUT/report.html" --force
