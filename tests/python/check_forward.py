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
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers: 2, 3, and", "def fibonacci(n):"]


class Reference:
    def __init__(self, path):
        r = GGUFReader(path)
        self.t = {t.name: t for t in r.tensors}
        f = r.fields
        self.L = int(f["llama.block_count"].contents())
        self.H = int(f["llama.attention.head_count"].contents())
        self.Hkv = int(f["llama.attention.head_count_kv"].contents())
        self.E = int(f["llama.embedding_length"].contents())
        self.d = self.E // self.H
        self.theta = float(f["llama.rope.freq_base"].contents())
        self.eps = float(f["llama.attention.layer_norm_rms_epsilon"].contents())

    def w(self, name):
        t = self.t[name]
        return dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64).reshape(
            [int(x) for x in reversed(t.shape)])

    def rope(self, x, pos):  # llama GGUF: adjacent pairs (2i, 2i+1)
        d = x.shape[-1]
        i = np.arange(d // 2)
        ang = pos[:, None] * self.theta ** (-2.0 * i / d)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def logits(self, ids, layers=None):
        """Last-token logits; when `layers` is a list, appends each layer's post-RoPE (q, k, v)."""
        n = len(ids)
        emb = self.w("token_embd.weight")
        x = emb[ids]
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.L):
            b = f"blk.{l}."
            h = self.norm(x, self.w(b + "attn_norm.weight"))
            q = (h @ self.w(b + "attn_q.weight").T).reshape(n, self.H, self.d)
            k = (h @ self.w(b + "attn_k.weight").T).reshape(n, self.Hkv, self.d)
            v = (h @ self.w(b + "attn_v.weight").T).reshape(n, self.Hkv, self.d)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if layers is not None:
                layers.append((q, k, v))
            g = self.H // self.Hkv
            out = np.empty((n, self.H, self.d))
            for hq in range(self.H):
                s = q[:, hq] @ k[:, hq // g].T / np.sqrt(self.d) + mask
                a = np.exp(s - s.max(-1, keepdims=True))
                a /= a.sum(-1, keepdims=True)
                out[:, hq] = a @ v[:, hq // g]
            x = x + out.reshape(n, -1) @ self.w(b + "attn_output.weight").T
            h = self.norm(x, self.w(b + "ffn_norm.weight"))
            gate = h @ self.w(b + "ffn_gate.weight").T
            up = h @ self.w(b + "ffn_up.weight").T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.w(b + "ffn_down.weight").T
        x = self.norm(x[-1], self.w("output_norm.weight"))
        return emb @ x


def log_softmax(z):
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


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
    import h5py
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, trace = os.path.join(tmp, "r.jsonl"), os.path.join(tmp, "t.h5")
        with open(jsonl, "w") as f:
            f.write(json.dumps({"id": "qkv", "context": "The secret code is 7421. Remember it well.",
                                "question": "What is the secret code?", "answer": "7421"}) + "\n")
        subprocess.run([kvsim, "capture", "-m", model, "-r", jsonl, "-o", trace, "--queries", "all"],
                       check=True, capture_output=True)
        with h5py.File(trace, "r") as f:
            req = f["requests"]["qkv"]
            ids = req["tokens"][:]
            got = {name: req[name][:].astype(np.float64) for name in ("q", "k", "v")}
            q_index = req["q_index"][:]
    layers = []
    ref.logits(ids, layers)
    worst = 0.0
    for l, (q, k, v) in enumerate(layers):
        for name, want in (("q", q[q_index]), ("k", k), ("v", v)):
            err = float(np.abs(got[name][l] - want).max() / np.abs(want).max())
            worst = max(worst, err)
            if err > 5e-3:
                failures.append(f"captured {name} of layer {l}: max error {err:.2e} of the tensor's scale")
    print(f"captured Q/K/V, {len(layers)} layers x {len(ids)} tokens: worst max error {worst:.2e} of scale")


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
