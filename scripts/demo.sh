#!/usr/bin/env bash
# The demo: set up (build, Python reference packages, SmolLM2 weights), generate needle tasks,
# capture a real SmolLM2 trace of them on the CPU, validate it, then sweep policies x budgets
# over it in both modes and print the ranked tables; finally re-run the sweep's best configs live
# on the really compressed cache (verify) and print how well the offline ranking predicted them;
# last, one HTML report of it all: Pareto frontiers, loss heatmaps, an attention map with each
# policy's kept tokens, and the offline-vs-live scatter.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${KVSIM_BUILD:-build}"
model="${KVSIM_CACHE:-$HOME/.cache/kvsim}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p out
"$build/kvsim" tasks needle --out out/demo-tasks.jsonl --count 4 --tokens 1024 --force
"$build/kvsim" capture --model "$model" --requests out/demo-tasks.jsonl --out out/demo.h5 --force \
  --queries eval --query-window 64 --max-new 24
"$build/kvsim" trace check out/demo.h5
policies="full,random,streamingllm,snapkv,pyramidkv,adakv,h2o:queries=recorded,tova,keydiff,expected_attention:queries=recorded,oracle_future,intn,kivi,varrate,qevict"
for mode in query-aware query-agnostic; do
  echo
  "$build/kvsim" sweep out/demo.h5 --policies "$policies" --budgets 0.1,0.25,0.5 --mode "$mode" \
    --out "out/demo-sweep-$mode.csv" --detail "out/demo-sweep-$mode.jsonl" --force
done
echo
"$build/kvsim" verify --model "$model" --tasks out/demo-tasks.jsonl --from-sweep out/demo-sweep-query-aware.csv --top 8 \
  --max-new 24 --out out/demo-verify.csv --force
"$build/kvsim" agreement --offline out/demo-sweep-query-aware.csv --live out/demo-verify.csv -o out/demo-agreement.csv \
  --force > /dev/null
"$build/kvsim" trace keep-sets out/demo.h5 -p "snapkv;h2o:queries=recorded;streamingllm;tova;kivi" -b 0.25 -l 15 \
  -o out/demo-keep.json --force > /dev/null
echo
"$build/kvsim" report out/demo-sweep-query-aware.csv out/demo-sweep-query-agnostic.csv out/demo-sweep-query-aware.jsonl \
  out/demo-verify.csv out/demo-agreement.csv out/demo.h5 out/demo-keep.json -o out/demo-report.html
echo "demo: open $(pwd)/out/demo-report.html in a browser"
