#!/usr/bin/env bash
# The serving experiment (issue 26, docs/experiments/serving.md). Part 1 measures three KV
# compression configs on SmolLM2 (SnapKV at 25% of the bytes, KIVI 4-bit and VarRate low rank at
# matched bytes), offline (sweep) and live (verify), query-agnostic, since a cached prefix is
# compressed before any question arrives. Part 2 replays the Mooncake sample through
# `kvsim serve simulate`: hit rate and TTFT against HBM size for every eviction policy, then the
# same with each compression config applied, then transitions at several assumed diff shares.
#   bench/serving_experiment.sh              (after scripts/setup.sh; ~10 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
PYTHON=${PYTHON:-$HOME/.cache/kvsim/venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
TRACE=${TRACE:-../shared/data/mooncake/synthetic_trace.jsonl}
OUT=${OUT:-out/serving}
POLICIES=${POLICIES:-"snapkv;kivi:bits=4;varrate"}
BUDGET=${BUDGET:-0.25}
HBM=${HBM:-32,64,120}
SIM=(--instances "${INSTANCES:-8}" --dram-gb "${DRAM_GB:-256}" --time-scale "${TIME_SCALE:-1}" --quiet)
mkdir -p "$OUT"

# Part 1: the configs' bytes and fidelity.
if [ ! -f "$OUT/verify.csv" ]; then
  : > "$OUT/tasks.jsonl"
  seed=31
  for kind in single multikey multivalue vartrack; do
    "$KVSIM" tasks needle --kind "$kind" --count 1 --tokens 1200 --seed $((seed++)) -o "$OUT/$kind.jsonl" --force
    cat "$OUT/$kind.jsonl" >> "$OUT/tasks.jsonl"
  done
  "$KVSIM" capture -m "$MODEL" -r "$OUT/tasks.jsonl" -o "$OUT/trace.h5" --force --queries all --max-new 16
  "$KVSIM" sweep "$OUT/trace.h5" -p "$POLICIES" -b "$BUDGET" --mode query-agnostic -o "$OUT/sweep.csv" --force -q
  "$KVSIM" verify -m "$MODEL" -t "$OUT/tasks.jsonl" -p "$POLICIES" -b "$BUDGET" --mode query-agnostic --max-new 16 \
    -o "$OUT/verify.csv" --force -q
fi
kv="none;snapkv@$BUDGET;kivi:bits=4@$BUDGET;varrate@$BUDGET"
results="$OUT/sweep.csv,$OUT/verify.csv"

# Part 2: capacity x eviction, without and with compression.
"$KVSIM" serve simulate "$TRACE" -e lru,lfu,slru,hits_per_token,rppc --hbm-gb "$HBM" "${SIM[@]}" \
  -o "$OUT/capacity.csv" --json "$OUT/capacity.json" --force | tee "$OUT/capacity.txt"
"$KVSIM" serve simulate "$TRACE" -e lru,rppc --hbm-gb "$HBM" --kv-policy "$kv" --kv-results "$results" "${SIM[@]}" \
  -o "$OUT/compression.csv" --json "$OUT/compression.json" --force | tee "$OUT/compression.txt"
# HBM only (no DRAM tier): what the tiers are worth.
"$KVSIM" serve simulate "$TRACE" -e lru,rppc --hbm-gb "$HBM" --instances "${INSTANCES:-8}" --time-scale "${TIME_SCALE:-1}" --quiet \
  -o "$OUT/hbm_only.csv" --force | tee "$OUT/hbm_only.txt"
# Transitions: the share of a sibling's tokens recomputed is an assumption; three of them.
for diff in 0.1 0.25 0.5; do
  "$KVSIM" serve simulate "$TRACE" -e lru,rppc --hbm-gb 64 "${SIM[@]}" --transitions --transition-diff "$diff" \
    -o "$OUT/transitions_$diff.csv" --force | tee "$OUT/transitions_$diff.txt"
done
# Overload: arrivals twice as fast, where throughput is capacity-bound.
"$KVSIM" serve simulate "$TRACE" -e lru,rppc --hbm-gb 64 --instances "${INSTANCES:-8}" --dram-gb "${DRAM_GB:-256}" \
  --time-scale 2 --kv-policy "$kv" --kv-results "$results" --quiet -o "$OUT/overload.csv" --force | tee "$OUT/overload.txt"
"$KVSIM" serve simulate "$TRACE" -e lru,rppc --hbm-gb 64 --instances "${INSTANCES:-8}" --dram-gb "${DRAM_GB:-256}" \
  --time-scale 2 --transitions --quiet -o "$OUT/overload_transitions.csv" --force | tee "$OUT/overload_transitions.txt"
"$PYTHON" analysis/serving_tables.py "$OUT" | tee "$OUT/tables.md"
# The figures (docs/reports.md); docs/experiments/figures/serving/ holds a copy for the page.
"$KVSIM" report "$OUT/sweep.csv" "$OUT/verify.csv" "$OUT/capacity.json" "$OUT/compression.json" -o "$OUT/report.html" --force
