#!/usr/bin/env bash
# The whole test suite: set up and build, then every C++, CLI, Python and GPU test through ctest.
# GPU tests report "Skipped" on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Parallel test processes share the cores: OpenMP threads that spin while waiting starve each other.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
ctest --test-dir "${KVSIM_BUILD:-build}" --output-on-failure -j "${KVSIM_JOBS:-2}"
