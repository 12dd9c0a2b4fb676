#!/usr/bin/env bash
# The whole test suite: set up and build, then every C++, CLI, Python and GPU test through ctest.
# GPU tests report "Skipped" on machines without a GPU.
#   scripts/test.sh              the suite on the normal build
#   scripts/test.sh --sanitize   the suite again on a clang ASan + UBSan build (build-sanitize/,
#                                CUDA and MPI off: the sanitizers instrument host code), with the
#                                libFuzzer targets and their smoke run (fuzz.smoke)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    *) echo "usage: scripts/test.sh [--sanitize]" >&2; exit 2 ;;
  esac
done
scripts/setup.sh "$@"
# Parallel test processes share the cores: OpenMP threads that spin while waiting starve each other.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
ctest --test-dir "${KVSIM_BUILD:-build}" --output-on-failure -j "${KVSIM_JOBS:-2}"
if [ "$sanitize" = 1 ]; then
  # clang, so that the same build holds the libFuzzer targets (fuzz/); fuzz.smoke runs them.
  cache="${KVSIM_CACHE:-$HOME/.cache/kvsim}"
  sbuild="${KVSIM_BUILD:-build}-sanitize"
  flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  cmake -S . -B "$sbuild" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
    -DKVSIM_CUDA=OFF -DKVSIM_MPI=OFF \
    -DKVSIM_FUZZ=ON -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DPython3_EXECUTABLE="$cache/venv/bin/python" -DKVSIM_MODEL_DIR="$cache/models" > /dev/null
  cmake --build "$sbuild" -j "${KVSIM_JOBS:-2}"
  # Every finding fails its test; leaks too (the process exits non-zero). Signals stay the
  # program's: tests crash child processes on purpose (run_isolated, hostile HDF5 files) and check
  # that they died by the signal.
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:handle_segv=0:handle_abort=0:handle_sigbus=0}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
    ctest --test-dir "$sbuild" --output-on-failure -j "${KVSIM_JOBS:-2}"
  scripts/clean_shm.sh
fi
