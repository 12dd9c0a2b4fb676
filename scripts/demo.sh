#!/usr/bin/env bash
# The demo: set up and build, synthesize a SmolLM2-shaped trace (needle tasks), validate it, then
# sweep policies x budgets over it in both modes and print the ranked tables.
# Later issues extend this to the whole pipeline (capture -> sweep -> verify -> report).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${KVSIM_BUILD:-build}"
mkdir -p out
"$build/kvsim" trace synth --out out/demo.h5 --force --requests 4 --context 2048 --queries eval --seed 1
"$build/kvsim" trace check out/demo.h5
policies="full,random,streamingllm,snapkv,pyramidkv,adakv,h2o:queries=recorded,tova,keydiff,expected_attention:queries=recorded,oracle_future"
for mode in query-aware query-agnostic; do
  echo
  "$build/kvsim" sweep out/demo.h5 --policies "$policies" --budgets 0.1,0.25,0.5 --mode "$mode" \
    --out "out/demo-sweep-$mode.csv" --detail "out/demo-sweep-$mode.jsonl" --force
done
