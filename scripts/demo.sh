#!/usr/bin/env bash
# The demo: set up (build, Python reference packages, the model weights), generate needle tasks,
# capture a real trace of them on the CPU, validate it, then sweep policies x budgets over it in
# both modes and print the ranked tables; finally re-run the sweep's best configs live on the
# really compressed cache (verify) and print how well the offline ranking predicted them; last,
# one HTML report of it all: Pareto frontiers, loss heatmaps, an attention map with each policy's
# kept tokens, and the offline-vs-live scatter.
#   scripts/demo.sh            SmolLM2-135M (the default)
#   scripts/demo.sh gemma3     Gemma 3 270M: longer prompts and higher budgets, since its 15
#                              sliding-window layers hold their 512-token windows whatever the
#                              budget (docs/models.md); outputs under out/demo-gemma3*
set -euo pipefail
cd "$(dirname "$0")/.."
which_model="${1:-smollm2}"
models="${KVSIM_CACHE:-$HOME/.cache/kvsim}/models"
policies="full,random,streamingllm,snapkv,pyramidkv,adakv,h2o:queries=recorded,tova,keydiff,expected_attention:queries=recorded,oracle_future,intn,kivi,varrate,qevict"
case "$which_model" in
  smollm2) model="$models/SmolLM2-135M-Instruct.Q4_1.gguf" out=out/demo tokens=1024 budgets=0.1,0.25,0.5 keep=0.25 layer=15 ;;
  gemma3) model="$models/gemma-3-270m-q4_k_m.gguf" out=out/demo-gemma3 tokens=3000 budgets=0.6,0.75,0.9 keep=0.6 layer=11 ;;
  *) echo "usage: scripts/demo.sh [smollm2|gemma3]" >&2; exit 2 ;;
esac
scripts/setup.sh
build="${KVSIM_BUILD:-build}"
mkdir -p out
"$build/kvsim" tasks needle --out "$out-tasks.jsonl" --count 4 --tokens "$tokens" --force
"$build/kvsim" capture --model "$model" --requests "$out-tasks.jsonl" --out "$out.h5" --force \
  --queries eval --query-window 64 --max-new 24
"$build/kvsim" trace check "$out.h5"
for mode in query-aware query-agnostic; do
  echo
  "$build/kvsim" sweep "$out.h5" --policies "$policies" --budgets "$budgets" --mode "$mode" \
    --out "$out-sweep-$mode.csv" --detail "$out-sweep-$mode.jsonl" --force
done
echo
"$build/kvsim" verify --model "$model" --tasks "$out-tasks.jsonl" --from-sweep "$out-sweep-query-aware.csv" --top 8 \
  --max-new 24 --out "$out-verify.csv" --force
"$build/kvsim" agreement --offline "$out-sweep-query-aware.csv" --live "$out-verify.csv" -o "$out-agreement.csv" \
  --force > /dev/null
"$build/kvsim" trace keep-sets "$out.h5" -p "snapkv;h2o:queries=recorded;streamingllm;tova;kivi" \
  -b "$keep" -l "$layer" -o "$out-keep.json" --force > /dev/null
echo
"$build/kvsim" report "$out-sweep-query-aware.csv" "$out-sweep-query-agnostic.csv" "$out-sweep-query-aware.jsonl" \
  "$out-verify.csv" "$out-agreement.csv" "$out.h5" "$out-keep.json" -o "$out-report.html" --force
echo "demo: open $(pwd)/$out-report.html in a browser"
