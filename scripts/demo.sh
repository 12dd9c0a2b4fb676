#!/usr/bin/env bash
# The demo: set up and build, synthesize a SmolLM2-shaped trace, validate it and summarise it.
# Later issues extend this to the whole pipeline (capture -> sweep -> verify -> report).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${KVSIM_BUILD:-build}"
mkdir -p out
"$build/kvsim" trace synth --out out/demo.h5 --force --requests 2 --context 1024 --seed 1
"$build/kvsim" trace check out/demo.h5
