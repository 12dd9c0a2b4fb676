#!/usr/bin/env bash
# Installs what kvsim needs (Debian packages, a Python venv) when missing, then builds.
# Idempotent: a second run only rebuilds what changed. Honoured environment variables:
#   KVSIM_CACHE   cache folder outside the repo (default ~/.cache/kvsim): Python venv, later model weights
#   KVSIM_BUILD   build folder (default build/)
#   KVSIM_CUDA    AUTO | ON | OFF (default AUTO: the CUDA parts are built when nvcc is found)
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${KVSIM_CACHE:-$HOME/.cache/kvsim}"
build="${KVSIM_BUILD:-build}"

apt_packages=(cmake make g++ pkg-config ccache python3 python3-venv
  libhdf5-dev libboost-program-options-dev libboost-graph-dev libeigen3-dev
  catch2 nlohmann-json3-dev libpcre2-dev libomp-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# pyenv or other non-Debian Pythons need no python3-venv package: their venv module is built in.
if [ ${#missing[@]} -gt 0 ] && command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == python3 || "$p" == python3-venv ]] || filtered+=("$p"); done
  missing=(${filtered[@]+"${filtered[@]}"})
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating Python venv in $venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import numpy, h5py' 2>/dev/null; then
  echo "setup: installing Python packages into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVSIM_CUDA="${KVSIM_CUDA:-AUTO}" \
  -DPython3_EXECUTABLE="$venv/bin/python" > "$build.configure.log" 2>&1 || {
  cat "$build.configure.log"
  exit 1
}
cmake --build "$build" -j "${KVSIM_JOBS:-2}"
