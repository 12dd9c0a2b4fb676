#!/usr/bin/env python3
"""The qwen2 path (Q/K/V biases, NEOX RoPE, untied output, the qwen2 pre-tokenizer) on a tiny
random Qwen2-shaped GGUF written with gguf-py's GGUFWriter, since no small real Qwen2 GGUF is
installable here: `kvsim capture` records Q/K/V that match the numpy reference layer by layer, and
reference log-probs (logsumexp and top-k) that match its logits. Weight types are mixed (F32, F16,
Q8_0, Q4_0, Q4_1, Q5_1) so both the block-dot and the generic dequantizing paths run."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType
from gguf.quants import quantize

from numpy_llama import Reference, log_softmax, qkv_error

L, E, H, HKV, FF = 2, 128, 4, 2, 192
D = E // H


def byte_level_vocab():
    """GPT-2's printable stand-ins for the 256 bytes (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_model(path):
    rng = np.random.default_rng(4)
    tokens = byte_level_vocab() + ["Ġt", "he", "Ġthe"]
    merges = ["Ġ t", "h e", "Ġt he"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [TokenType.NORMAL] * len(tokens) + [TokenType.CONTROL] * len(specials)
    tokens += specials
    w = GGUFWriter(path, "qwen2")
    w.add_name("tiny-qwen2-random")
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(E)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(len(tokens) - 1)
    V = len(tokens)

    def tensor(name, shape, qtype, scale=0.08):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype == QT.F32:
            w.add_tensor(name, x)
        elif qtype == QT.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)

    tensor("token_embd.weight", (V, E), QT.Q8_0, 1.0)
    tensor("output_norm.weight", (E,), QT.F32, 1.0)
    tensor("output.weight", (V, E), QT.Q4_0)
    for l in range(L):
        b = f"blk.{l}."
        tensor(b + "attn_norm.weight", (E,), QT.F32, 1.0)
        tensor(b + "ffn_norm.weight", (E,), QT.F32, 1.0)
        tensor(b + "attn_q.weight", (H * D, E), QT.Q8_0)
        tensor(b + "attn_k.weight", (HKV * D, E), QT.Q4_1)
        tensor(b + "attn_v.weight", (HKV * D, E), QT.F16)
        tensor(b + "attn_q.bias", (H * D,), QT.F32, 0.5)
        tensor(b + "attn_k.bias", (HKV * D,), QT.F32, 0.5)
        tensor(b + "attn_v.bias", (HKV * D,), QT.F32, 0.5)
        tensor(b + "attn_output.weight", (E, H * D), QT.Q5_1)
        tensor(b + "ffn_gate.weight", (FF, E), QT.Q4_1)
        tensor(b + "ffn_up.weight", (FF, E), QT.Q8_0)
        tensor(b + "ffn_down.weight", (E, FF), QT.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    kvsim = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        model, jsonl = os.path.join(tmp, "tiny-qwen2.gguf"), os.path.join(tmp, "r.jsonl")
        write_model(model)
        ref = Reference(model)
        assert ref.neox and ref.has("blk.0.attn_q.bias")
        with open(jsonl, "w") as f:
            f.write(json.dumps({"id": "q", "context": "the cat sat on the mat; 12345 the end.",
                                "question": "Where did the cat sit?", "answer": "on the mat"}) + "\n")
        for weights in ("quant", "f32"):
            trace = os.path.join(tmp, f"t-{weights}.h5")
            subprocess.run([kvsim, "capture", "-m", model, "-r", jsonl, "-o", trace, "--queries", "all",
                            "--weights", weights], check=True, capture_output=True)
            ids, logits, rows = qkv_error(trace, ref, 5e-3, failures, f"qwen2 weights {weights}")
            lp = log_softmax(logits)
            lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            idx = rows["index"]
            err_lse = float(np.abs(rows["lse"] - lse[idx]).max())
            err_logp = float(np.abs(rows["topk_logp"] - np.take_along_axis(lp[idx], rows["topk_ids"], 1)).max())
            top1 = float((rows["topk_ids"][:, 0] == lp[idx].argmax(-1)).mean())
            print(f"qwen2 weights {weights}: {len(idx)} reference rows, max |lse error| {err_lse:.2e}, "
                  f"max |top-k log-prob error| {err_logp:.2e}, top-1 agreement {top1:.2f}")
            if not (err_lse < 1e-3 and err_logp < 1e-3 and top1 == 1.0):
                failures.append(f"qwen2 weights {weights}: reference distribution disagrees")
            if not (len(ids) > 30 and 260 in ids.tolist() and 258 in ids.tolist()):  # "<|im_start|>" and a merge
                failures.append(f"qwen2 weights {weights}: prompt not tokenized as expected ({ids.tolist()})")
    for f in failures:
        print("FAIL:", f)
    print(f"qwen2 check: {'failed' if failures else 'passed'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
