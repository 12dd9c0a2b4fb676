#!/usr/bin/env python3
"""The CPU engine against an independent numpy forward pass (float64, weights dequantized by
gguf-py): next-token distributions agree (KL < 1e-4) with the same argmax on a few prompts, with
the weights kept quantized and dequantized to f32; and the post-RoPE Q/K/V that `kvsim capture`
records agree with the reference's, layer by layer, to f16 precision."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from numpy_llama import Reference, log_softmax, qkv_error

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers: 2, 3, and", "def fibonacci(n):"]


def check_logits(kvsim, model, ref, failures):
    for weights in ("quant", "f32"):
        for p in PROMPTS:
            out = subprocess.run([kvsim, "model", "generate", model, "--chat", "--text", p, "--logits",
                                  "--weights", weights], check=True, capture_output=True, text=True)
            j = json.loads(out.stdout)
            ours = np.array(j["logits"], dtype=np.float64)
            theirs = ref.logits(np.array(j["ids"]))
            lp, lq = log_softmax(theirs), log_softmax(ours)
            kl = float((np.exp(lp) * (lp - lq)).sum())
            same = int(ours.argmax()) == int(theirs.argmax())
            print(f"weights {weights:5s} {p!r}: KL(ref || kvsim) = {kl:.2e}, argmax {int(ours.argmax())} vs "
                  f"{int(theirs.argmax())}")
            if not (kl < 1e-4 and same):
                failures.append(f"logits, weights {weights}, {p!r}")


def check_captured_qkv(kvsim, model, ref, failures):
    """Every layer's Q/K/V in a captured trace against the reference's, relative to each tensor's
    scale: f16 storage rounds at 2^-11 relative, f32 arithmetic drifts a little with depth."""
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, trace = os.path.join(tmp, "r.jsonl"), os.path.join(tmp, "t.h5")
        with open(jsonl, "w") as f:
            f.write(json.dumps({"id": "qkv", "context": "The secret code is 7421. Remember it well.",
                                "question": "What is the secret code?", "answer": "7421"}) + "\n")
        subprocess.run([kvsim, "capture", "-m", model, "-r", jsonl, "-o", trace, "--queries", "all"],
                       check=True, capture_output=True)
        qkv_error(trace, ref, 5e-3, failures, "SmolLM2")


def main():
    kvsim, model = sys.argv[1], sys.argv[2]
    ref = Reference(model)
    failures = []
    check_logits(kvsim, model, ref, failures)
    check_captured_qkv(kvsim, model, ref, failures)
    for f in failures:
        print("FAIL:", f)
    print(f"forward check: {'failed' if failures else 'passed'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
