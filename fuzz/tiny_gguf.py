"""Shrinks a real GGUF model into a fuzzing seed of a few tens of KB: the same metadata keys
(dimensions cut down, the vocabulary cut to its first tokens) and the same tensors, types and real
quantized bytes (each tensor's first rows and first blocks of each row), 2 layers.

usage: tiny_gguf.py SRC.gguf OUT.gguf [--vocab N]
"""
import argparse
import numpy as np
import gguf
from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType as Q

K_QUANTS = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K}


def new_dims(r, arch):
    """Old dimension -> new one, for every dimension the tensors use."""
    get = lambda k: int(r.fields[f"{arch}.{k}"].contents())
    e, f, h, hkv = get("embedding_length"), get("feed_forward_length"), get("attention.head_count"), get("attention.head_count_kv")
    hd = get("attention.key_length") if f"{arch}.attention.key_length" in r.fields else e // h
    kq_rows = {int(t.shape[0]) for t in r.tensors if t.tensor_type in K_QUANTS}
    # K-quant rows hold 256-value blocks: a dimension that is one's row length stays a multiple of 256.
    hd_new = 128 if (h * hd in kq_rows or hkv * hd in kq_rows) else 16
    dims = {
        "e": 256 if e in kq_rows else 32,
        "f": 256 if f in kq_rows else 64,
        "h": 2, "hkv": 1, "hd": hd_new,
    }
    old = {e: dims["e"], f: dims["f"], h * hd: 2 * hd_new, hkv * hd: hd_new, hd: hd_new}
    return dims, old


def copy_tensor(t, old_to_new, vocab_old, vocab_new):
    ne = [int(x) for x in t.shape]  # GGUF order: ne[0] is the row
    new_ne = [vocab_new if n == vocab_old else old_to_new.get(n, n) for n in ne]
    blk, bsz = gguf.GGML_QUANT_SIZES[t.tensor_type]
    rows_old = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    rows_new = int(np.prod(new_ne[1:])) if len(new_ne) > 1 else 1
    raw = np.asarray(t.data).reshape(rows_old, -1)
    per_row = new_ne[0] // blk * bsz if t.tensor_type not in (Q.F32, Q.F16, Q.BF16) else new_ne[0]
    # numpy order, the row last; a quantized row as its bytes (what GGUFWriter expects)
    shape = list(reversed(new_ne))[:-1] + [per_row]
    return np.ascontiguousarray(raw[:rows_new, :per_row]).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=300)
    a = ap.parse_args()
    r = GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    dims, old_to_new = new_dims(r, arch)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    vocab_old, v = len(tokens), a.vocab
    kept = set(tokens[:v])
    w = gguf.GGUFWriter(a.out, arch)
    overrides = {
        f"{arch}.block_count": 2, f"{arch}.embedding_length": dims["e"], f"{arch}.feed_forward_length": dims["f"],
        f"{arch}.attention.head_count": dims["h"], f"{arch}.attention.head_count_kv": dims["hkv"],
        f"{arch}.attention.key_length": dims["hd"], f"{arch}.attention.value_length": dims["hd"],
        f"{arch}.rope.dimension_count": dims["hd"], f"{arch}.vocab_size": v, f"{arch}.attention.sliding_window": 4,
    }
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        val = field.contents()
        if key in overrides:
            val = overrides[key]
        elif key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            val = val[:v]
        elif key == "tokenizer.ggml.merges":
            val = [m for m in val if all(p in kept for p in m.split(" ", 1)) and m.replace(" ", "", 1) in kept]
        w.add_key_value(key, val, vtype, sub)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= 2:
            continue
        w.add_tensor(t.name, copy_tensor(t, old_to_new, vocab_old, v), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
