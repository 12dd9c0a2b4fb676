#!/usr/bin/env bash
# Installs what kvsim needs (Debian packages, a Python venv) when missing, then builds.
# Idempotent: a second run only rebuilds what changed. Honoured environment variables:
#   KVSIM_CACHE   cache folder outside the repo (default ~/.cache/kvsim): Python venv, model weights
#   KVSIM_BUILD   build folder (default build/)
#   KVSIM_CUDA    AUTO | ON | OFF (default AUTO: the CUDA parts are built when nvcc is found)
#   KVSIM_MPI     AUTO | ON | OFF (default AUTO: MPI sweeps are built when OpenMPI is found)
#   KVSIM_JOBS    parallel build jobs (default 2)
# --sanitize also installs what scripts/test.sh --sanitize builds with: clang, its sanitizer and
# libFuzzer runtimes, clang's OpenMP, and llvm-symbolizer (package llvm), without which sanitizer
# reports have no function names and fuzz/triage.py cannot place a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    *) echo "usage: scripts/setup.sh [--sanitize]" >&2; exit 2 ;;
  esac
done

cache="${KVSIM_CACHE:-$HOME/.cache/kvsim}"
build="${KVSIM_BUILD:-build}"

required=(cmake make g++ pkg-config python3 python3-venv
  libhdf5-dev libboost-program-options-dev libboost-graph-dev libeigen3-dev
  catch2 nlohmann-json3-dev libpcre2-dev clang-format)
[ "$sanitize" = 0 ] || required+=(clang libclang-rt-dev libomp-dev llvm)
optional=(ccache)  # faster rebuilds; installed alongside the others, never a reason to ask for root
# Wanted, not required: a headless browser renders the report in its test (`kvsim report`), and
# OpenMPI gives `mpirun -np N kvsim sweep` (docs/scale_out.md); where they cannot be installed,
# kvsim builds without MPI and those tests are skipped.
wanted=(chromium openmpi-bin libopenmpi-dev)

is_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${required[@]}"; do is_installed "$p" || missing+=("$p"); done
# A non-Debian python3 (pyenv, ...) with a working venv module needs no python3-venv package.
if command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  kept=()
  for p in ${missing[@]+"${missing[@]}"}; do [[ "$p" == python3 || "$p" == python3-venv ]] || kept+=("$p"); done
  missing=(${kept[@]+"${kept[@]}"})
fi
if [ ${#missing[@]} -gt 0 ]; then
  for p in "${optional[@]}"; do is_installed "$p" || missing+=("$p"); done
  echo "setup: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    as_root=(env DEBIAN_FRONTEND=noninteractive)
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
  else
    echo "setup: these Debian packages are missing and this user cannot install them:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    echo "setup: run that as root, then run this script again" >&2
    exit 1
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
want=()
for p in "${wanted[@]}"; do is_installed "$p" || want+=("$p"); done
if [ ${#want[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
    root=(); [ "$(id -u)" -eq 0 ] || root=(sudo)
    echo "setup: installing ${want[*]} (report rendering in the tests, MPI sweeps)"
    "${root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" ||
      echo "setup: could not install ${want[*]}; the report's browser test and MPI sweeps are skipped" >&2
  else
    echo "setup: ${want[*]} missing and this user cannot install them; the report's browser test and MPI sweeps are skipped" >&2
  fi
fi

venv="$cache/venv"
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "setup: creating Python venv in $venv"
  mkdir -p "$cache"
  python3 -m venv --clear "$venv"
fi
if ! "$venv/bin/python" -c 'import numpy, h5py, gguf, tokenizers, pandas, matplotlib, sentencepiece, google.protobuf' 2>/dev/null; then
  echo "setup: installing Python packages into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
fi

scripts/fetch_model.sh "$venv/bin/python" "$cache"

mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVSIM_CUDA="${KVSIM_CUDA:-AUTO}" -DKVSIM_MPI="${KVSIM_MPI:-AUTO}" \
  -DPython3_EXECUTABLE="$venv/bin/python" -DKVSIM_MODEL_DIR="$cache/models" > "$build/configure.log" 2>&1 || {
  cat "$build/configure.log"
  exit 1
}
cmake --build "$build" -j "${KVSIM_JOBS:-2}"
