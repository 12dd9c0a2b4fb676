"""An independent float64 numpy forward pass of a Llama-family GGUF model (llama: adjacent-pair
RoPE; qwen2: Q/K/V biases and NEOX half-split RoPE; gemma3: scaled embeddings, per-head Q/K
RMSNorm, post-norms, GeGLU, sliding-window layers with their own RoPE base), weights dequantized
by gguf-py. The oracle the CPU engine is checked against; written from the model definitions (the
Gemma 3 paper and Hugging Face's reference modelling code, as described in docs/models.md), not
from kvsim's code."""
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Reference:
    def __init__(self, path):
        r = GGUFReader(path)
        self.t = {t.name: t for t in r.tensors}
        self._cache = {}
        f = r.fields
        self.arch = f["general.architecture"].contents()
        a = self.arch + "."
        self.L = int(f[a + "block_count"].contents())
        self.H = int(f[a + "attention.head_count"].contents())
        self.Hkv = int(f[a + "attention.head_count_kv"].contents())
        self.E = int(f[a + "embedding_length"].contents())
        self.d = int(f[a + "attention.key_length"].contents()) if a + "attention.key_length" in f else self.E // self.H
        self.theta = float(f[a + "rope.freq_base"].contents())
        self.eps = float(f[a + "attention.layer_norm_rms_epsilon"].contents())
        self.neox = self.arch in ("qwen2", "gemma3")
        self.gemma = self.arch == "gemma3"
        if self.gemma:
            # Every 6th layer attends globally with the file's RoPE base; the others see a window of
            # `sliding_window` tokens with base 10000. Queries scale by 1/sqrt(query_pre_attn_scalar).
            self.window = int(f[a + "attention.sliding_window"].contents())
            self.local = [l % 6 != 5 for l in range(self.L)]
            self.local_theta = 10000.0
            self.scale = 1 / np.sqrt(self.d)

    def w(self, name):
        if name not in self._cache:  # dequantized once per tensor
            t = self.t[name]
            self._cache[name] = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64).reshape(
                [int(x) for x in reversed(t.shape)])
        return self._cache[name]

    def has(self, name):
        return name in self.t

    def rope(self, x, pos, theta=None):
        d = x.shape[-1]
        i = np.arange(d // 2)
        ang = pos[:, None] * (theta or self.theta) ** (-2.0 * i / d)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        # llama GGUF pairs adjacent dims (2i, 2i+1); NEOX pairs i with i + d/2.
        lo, hi = (slice(0, d // 2), slice(d // 2, d)) if self.neox else (slice(0, d, 2), slice(1, d, 2))
        x0, x1 = x[..., lo], x[..., hi]
        out = np.empty_like(x)
        out[..., lo] = x0 * c - x1 * s
        out[..., hi] = x0 * s + x1 * c
        return out

    def norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def forward(self, ids, layers=None):
        """Logits of every position [n, vocab]; when `layers` is a list, appends each layer's
        post-RoPE (q, k, v)."""
        n = len(ids)
        emb = self.w("token_embd.weight")
        x = emb[ids] * (np.sqrt(self.E) if self.gemma else 1.0)
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.L):
            b = f"blk.{l}."
            local = self.gemma and self.local[l]
            h = self.norm(x, self.w(b + "attn_norm.weight"))
            q, k, v = (h @ self.w(b + f"attn_{p}.weight").T for p in "qkv")
            if self.has(b + "attn_q.bias"):
                q, k, v = q + self.w(b + "attn_q.bias"), k + self.w(b + "attn_k.bias"), v + self.w(b + "attn_v.bias")
            q, k, v = q.reshape(n, self.H, self.d), k.reshape(n, self.Hkv, self.d), v.reshape(n, self.Hkv, self.d)
            if self.gemma:
                q, k = self.norm(q, self.w(b + "attn_q_norm.weight")), self.norm(k, self.w(b + "attn_k_norm.weight"))
            theta = self.local_theta if local else None
            q, k = self.rope(q, pos, theta), self.rope(k, pos, theta)
            if layers is not None:
                layers.append((q, k, v))
            g = self.H // self.Hkv
            out = np.empty((n, self.H, self.d))
            lmask = mask
            if local:  # key j visible to query i only when i - j < window
                lmask = mask + np.where(pos[:, None] - pos[None, :] >= self.window, -np.inf, 0.0)
            for hq in range(self.H):
                s = q[:, hq] @ k[:, hq // g].T / np.sqrt(self.d) + lmask
                a = np.exp(s - s.max(-1, keepdims=True))
                a /= a.sum(-1, keepdims=True)
                out[:, hq] = a @ v[:, hq // g]
            o = out.reshape(n, -1) @ self.w(b + "attn_output.weight").T
            x = x + (self.norm(o, self.w(b + "post_attention_norm.weight")) if self.gemma else o)
            h = self.norm(x, self.w(b + "ffn_norm.weight"))
            gate = h @ self.w(b + "ffn_gate.weight").T
            up = h @ self.w(b + "ffn_up.weight").T
            if self.gemma:  # GeGLU with GELU's tanh form
                act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
            else:
                act = gate / (1 + np.exp(-gate))
            f = (act * up) @ self.w(b + "ffn_down.weight").T
            x = x + (self.norm(f, self.w(b + "post_ffw_norm.weight")) if self.gemma else f)
        out_w = self.w("output.weight") if self.has("output.weight") else emb
        return self.norm(x, self.w("output_norm.weight")) @ out_w.T

    def logits(self, ids, layers=None):
        return self.forward(ids, layers)[-1]


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def qkv_error(trace, ref, tolerance, failures, label):
    """Largest error of a captured trace's per-layer Q/K/V against the reference, relative to
    each tensor's scale (f16 storage rounds at 2^-11); returns the ids and reference logits."""
    import h5py
    with h5py.File(trace, "r") as f:
        rid = next(iter(f["requests"]))
        req = f["requests"][rid]
        ids = req["tokens"][:]
        got = {name: req[name][:].astype(np.float64) for name in ("q", "k", "v")}
        q_index = req["q_index"][:]
        ref_rows = {name: req["ref"][name][:] for name in ("index", "lse", "topk_ids", "topk_logp")}
    layers = []
    logits = ref.forward(ids, layers)
    worst = 0.0
    for l, (q, k, v) in enumerate(layers):
        for name, want in (("q", q[q_index]), ("k", k), ("v", v)):
            err = float(np.abs(got[name][l] - want).max() / np.abs(want).max())
            worst = max(worst, err)
            if err > tolerance:
                failures.append(f"{label}: captured {name} of layer {l}: max error {err:.2e} of the tensor's scale")
    print(f"{label}: captured Q/K/V, {len(layers)} layers x {len(ids)} tokens: worst max error {worst:.2e} of scale")
    return ids, logits, ref_rows
