#!/usr/bin/env bash
# The device check (issue 7), for a machine with an NVIDIA GPU and the CUDA toolkit (nothing else
# needed: it builds only core/ and gpu/, KVSIM_GPU_ONLY). Builds, runs the GPU tests and the
# parity harness with its benchmarks, and writes a compact report under $OUT:
#   device.txt  GPU, driver and nvcc versions
#   ctest.txt   gpu.half_parity (skipped = no GPU seen: a failure of the check)
#   parity.txt  the packed-cache kernels against their CPU references (NMSE) at SmolLM2-135M
#               and Mistral-7B shapes: the packed-row unpack and the fused decode over packed
#               rows; the CUDA transformer against
#               gpu/cuda_transformer_ref with random weights (qwen2-like fp32 and fp16, head_dim
#               32/96/256 corner shapes, SmolLM2-135M, Mistral-7B layer shapes): prefill with
#               capture, decode, chunked prefill, per-query-head caches, packed caches held
#               packed on the device (with their device bytes), decode rules (H2O, TOVA) run
#               on the device; then the benchmarks: kernel bandwidth vs the device's copy
#               bandwidth (fused packed decode vs unpack-then-attend vs an fp16 cache),
#               prefill/decode tokens/s vs the cuBLAS GEMM rate, capture overhead, an H2O
#               decode step on the device vs through the host, all measured in the same run
# The same harness runs in CI on the CPU emulator (gpu.parity_emulated: SmolLM2-sized sections,
# benchmarks at --smoke sizes), so its code has run before it reaches a device.
# Real SmolLM2 weights do not travel (98 MB > the 64 MiB per call): the GGUF path is covered on
# the CPU (tests/test_transformer_ref.cpp, tests/test_backend_engine.cpp) and the GPU is held to
# the same reference here with random weights of the same shapes.
# Usage (device tool): OUT=$OUT bash bench/gpu_check.sh      (~3-4 min on 16 cores)
set -uo pipefail
start=$SECONDS
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_check}
BUILD=${KVSIM_GPU_BUILD:-build-gpu}
mkdir -p "$OUT"
status=0
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
} > "$OUT/device.txt"
if ! cmake -S . -B "$BUILD" -DKVSIM_GPU_ONLY=ON -DCMAKE_BUILD_TYPE=Release > "$OUT/configure.log" 2>&1 ||
   ! cmake --build "$BUILD" -j "$(nproc)" > "$OUT/build.log" 2>&1; then
  echo "gpu_check: build failed (see $OUT/configure.log, $OUT/build.log)"
  tail -30 "$OUT/build.log" "$OUT/configure.log" 2>/dev/null
  exit 1
fi
(cd "$BUILD" && ctest --output-on-failure -R gpu.half_parity) > "$OUT/ctest.txt" 2>&1 || status=1
if grep -q "Skipped" "$OUT/ctest.txt"; then
  echo "gpu_check: the GPU tests were skipped: no GPU visible" | tee -a "$OUT/ctest.txt"
  status=1
fi
# gpu.parity's run, with the benchmarks (ctest would run it a second time without them). Each
# section runs on its own and the report is written line by line, so a failure or the time limit
# (PARITY_TIMEOUT seconds; by default what is left of 8 minutes after the build, less 30 s for the
# kill and the report) still leaves every result so far in parity.txt. For a rerun of what
# failed: PARITY_ONLY="packed unpack,qwen2-like fp32" (substrings of `kvsim-parity --list`), and
# SANITIZE=1 runs those sections under compute-sanitizer's memcheck (slow: only with PARITY_ONLY).
parity=("$BUILD/gpu/kvsim-parity" --report "$OUT/parity.txt")
[ -n "${PARITY_ONLY:-}" ] && parity+=(--only "$PARITY_ONLY")
if [ "${SANITIZE:-0}" = 1 ]; then
  if [ -z "${PARITY_ONLY:-}" ]; then
    echo "gpu_check: SANITIZE=1 needs PARITY_ONLY (every section under memcheck would outrun the time limit)"
    exit 2
  fi
  parity=(compute-sanitizer --tool memcheck --error-exitcode 99 --log-file "$OUT/sanitizer.txt" "${parity[@]}")
else
  parity+=(--bench)
fi
if [ -n "${PARITY_TIMEOUT:-}" ]; then
  limit=$PARITY_TIMEOUT
else
  limit=$((450 - (SECONDS - start)))
  [ "$limit" -lt 60 ] && limit=60  # a slow build still leaves the harness a minute
fi
timeout -k 20 "$limit" "${parity[@]}"
rc=$?
[ "${SANITIZE:-0}" = 1 ] && grep -h "ERROR SUMMARY" "$OUT/sanitizer.txt" 2>/dev/null
[ $rc -eq 77 ] && echo "gpu_check: kvsim-parity saw no GPU"
[ $rc -eq 124 ] && echo "gpu_check: kvsim-parity ran past $limit s; parity.txt has what it checked" |
  tee -a "$OUT/parity.txt"
[ $rc -ne 0 ] && status=1
cat "$OUT/device.txt" "$OUT/ctest.txt" | tail -20
echo "gpu_check: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s; report in $OUT"
exit $status
