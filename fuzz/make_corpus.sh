#!/usr/bin/env bash
# Seeds for the fuzz targets, from real files: the real models shrunk (tiny_gguf.py), traces and
# request files written by kvsim's own writers, Mooncake traces in the published format, sweep
# results and every registered policy's spec written by the targets themselves.
#   fuzz/make_corpus.sh BUILD OUT     BUILD holds kvsim and fuzz/ (a KVSIM_FUZZ=ON build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1
out=$2
cache="${KVSIM_CACHE:-$HOME/.cache/kvsim}"
py="$cache/venv/bin/python"
kvsim="$build/kvsim"
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
targets=(fuzz_gguf fuzz_trace fuzz_trace_hdf5 fuzz_requests fuzz_mooncake fuzz_sweep_resume fuzz_policy_spec
         fuzz_learned_model fuzz_serve_profile fuzz_estimator fuzz_basis fuzz_rlkv_tsv fuzz_verify_csv fuzz_result_files)
for t in "${targets[@]}"; do mkdir -p "$out.tmp/$t"; done

for m in SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m; do
  "$py" fuzz/tiny_gguf.py "$cache/models/$m.gguf" "$out.tmp/fuzz_gguf/$m.gguf"
done

small=(--q-heads 2 --kv-heads 1 --head-dim 16 --vocab 100 --requests 2 --system 2 --context 24
       --question 3 --generated 2 --needle 2 --ref-topk 4)
"$kvsim" trace synth -o "$out.tmp/fuzz_trace/plain.h5" "${small[@]}" --layers 2 > /dev/null
"$kvsim" trace synth -o "$out.tmp/fuzz_trace/repeat_pass.h5" "${small[@]}" --layers 2 --repeat-pass > /dev/null
"$kvsim" trace synth -o "$out.tmp/fuzz_trace/eval_queries.h5" "${small[@]}" --layers 2 --queries eval --query-window 4 > /dev/null
"$kvsim" trace synth -o "$out.tmp/fuzz_trace/windowed.h5" "${small[@]}" --layers 3 --sliding-window 4 --global-every 3 \
  --rope-theta-local 10000 > /dev/null

for kind in single multikey multivalue vartrack; do
  "$kvsim" tasks needle -o "$out.tmp/fuzz_requests/$kind.jsonl" --kind "$kind" --count 2 --tokens 64 > /dev/null
done
"$kvsim" tasks text README.md -o "$out.tmp/fuzz_requests/text.jsonl" --tokens 48 --count 2 > /dev/null

PYTHONPATH=tests/python "$py" - "$out.tmp/fuzz_mooncake" <<'PY'
import sys
from branching_trace import write_branching_trace
d = sys.argv[1]
write_branching_trace(f"{d}/branching.jsonl", 1, 12, 3, 100, (1, 64))
write_branching_trace(f"{d}/long_prefixes.jsonl", 2, 8, 6, 0, 16)
write_branching_trace(f"{d}/two.jsonl", 3, 2, 2, 5, 1)
PY

cp "$out.tmp/fuzz_trace/"*.h5 "$out.tmp/fuzz_trace_hdf5/"
# The smallest traces the writer makes (~40 KB, nearly all HDF5 metadata): what the hostile-trace
# corpus (tests/python/make_hostile_traces.py) was grown from, so its inputs stay small.
tiny=(--layers 1 --q-heads 1 --kv-heads 1 --head-dim 16 --vocab 16 --requests 1 --system 1 --context 4 --question 1
      --generated 1 --needle 1 --ref-topk 1)
"$kvsim" trace synth -o "$out.tmp/fuzz_trace_hdf5/tiny.h5" "${tiny[@]}" > /dev/null
"$kvsim" trace synth -o "$out.tmp/fuzz_trace_hdf5/tiny_repeat.h5" "${tiny[@]}" --repeat-pass > /dev/null

# The targets that write their own seeds with kvsim's writers.
for t in fuzz_sweep_resume fuzz_policy_spec fuzz_learned_model fuzz_serve_profile fuzz_estimator fuzz_basis fuzz_rlkv_tsv \
         fuzz_verify_csv fuzz_result_files; do
  KVSIM_FUZZ_WRITE_SEEDS="$out.tmp/$t" "$build/fuzz/$t" > /dev/null
done
rm -rf "$out" && mv "$out.tmp" "$out"
