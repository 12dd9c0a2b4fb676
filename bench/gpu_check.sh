#!/usr/bin/env bash
# The device check (issue 7), for a machine with an NVIDIA GPU and the CUDA toolkit (nothing else
# needed: it builds only core/ and gpu/, KVSIM_GPU_ONLY). Builds, runs the GPU tests and the
# parity harness with its bandwidth benchmark, and writes a compact report under $OUT:
#   device.txt  GPU, driver and nvcc versions
#   ctest.txt   gpu.half_parity and gpu.parity (skipped = no GPU seen: a failure of the check)
#   parity.txt  every kernel against its CPU reference (NMSE, keep-set equality) at SmolLM2-135M
#               and Mistral-7B shapes, and each attention kernel's bandwidth as a share of the
#               device-to-device copy bandwidth measured in the same run
# Usage (device tool): OUT=$OUT bash bench/gpu_check.sh      (~1-2 min on 16 cores)
set -uo pipefail
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
(cd "$BUILD" && ctest --output-on-failure) > "$OUT/ctest.txt" 2>&1 || status=1
if grep -q "Skipped" "$OUT/ctest.txt"; then
  echo "gpu_check: the GPU tests were skipped: no GPU visible" | tee -a "$OUT/ctest.txt"
  status=1
fi
"$BUILD/gpu/kvsim-parity" --bench --report "$OUT/parity.txt" || status=1
cat "$OUT/device.txt" "$OUT/ctest.txt" | tail -20
echo "gpu_check: $([ $status -eq 0 ] && echo passed || echo FAILED); report in $OUT"
exit $status
