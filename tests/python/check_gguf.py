#!/usr/bin/env python3
"""kvsim's GGUF reader and dequantizers against llama.cpp's gguf-py, bit for bit:
(1) real tensors of the SmolLM2-135M Q4_1 file (Q8_0 embedding, Q4_1 projections, F32 norms);
(2) a crafted GGUF with random blocks of every type kvsim dequantizes."""
import json
import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter
from gguf.quants import dequantize
from gguf.constants import GGML_QUANT_SIZES

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


def ours(kvsim, path, name, row, rows):
    out = subprocess.run([kvsim, "model", "dump", path, "--tensor", name, "--row", str(row), "--rows", str(rows)],
                         check=True, capture_output=True, text=True)
    j = json.loads(out.stdout)
    return np.array(j["values"], dtype=np.float32).reshape(rows, j["row_size"])


def theirs(reader, name, row, rows):
    t = next(t for t in reader.tensors if t.name == name)
    data = np.asarray(t.data)
    values = dequantize(data, t.tensor_type).astype(np.float32)
    return values.reshape(-1, int(t.shape[0]))[row:row + rows]


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def real_model(kvsim, model):
    reader = GGUFReader(model)
    for name, row, rows in [("token_embd.weight", 0, 3), ("token_embd.weight", 49149, 3),
                            ("blk.0.attn_q.weight", 0, 8), ("blk.29.ffn_down.weight", 570, 6),
                            ("blk.7.attn_norm.weight", 0, 1), ("output_norm.weight", 0, 1)]:
        expect(same_bits(ours(kvsim, model, name, row, rows), theirs(reader, name, row, rows)),
               f"SmolLM2 {name} rows {row}..{row + rows}: kvsim differs from gguf-py")


def crafted(kvsim, workdir):
    rng = np.random.default_rng(3)
    path = os.path.join(workdir, "crafted_blocks.gguf")
    types = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
    # Offsets of the half-precision scale fields inside each block type: random bytes there
    # could be NaN/Inf, whose payload handling is not what is being tested.
    half_fields = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2],
                   T.Q5_K: [0, 2], T.Q6_K: [208]}
    w = GGUFWriter(path, "llama")
    for qt in types:
        block, size = GGML_QUANT_SIZES[qt]
        row_elems, rows = 512, 4
        blocks = rng.integers(0, 256, size=(rows * row_elems // block, size), dtype=np.uint8)
        for off in half_fields.get(qt, []):
            blocks[:, off:off + 2] = rng.normal(0, 0.05, size=(blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
        if qt in (T.F32, T.F16, T.BF16):  # plain floats: finite random values
            vals = rng.normal(0, 1, size=rows * row_elems)
            blocks = {T.F32: vals.astype(np.float32).view(np.uint8), T.F16: vals.astype(np.float16).view(np.uint8),
                      T.BF16: (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)}[qt]
        w.add_tensor(f"t_{qt.name}", blocks.reshape(rows, -1), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = GGUFReader(path)
    for qt in types:
        name = f"t_{qt.name}"
        expect(same_bits(ours(kvsim, path, name, 0, 4), theirs(reader, name, 0, 4)),
               f"crafted {qt.name} blocks: kvsim differs from gguf-py")


def main():
    kvsim, workdir, model = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(workdir, exist_ok=True)
    if not os.path.exists(model):
        print(f"FAIL: {model} is missing: run scripts/setup.sh, which fetches it")
        print("gguf check: 0 passed, 1 failed")
        return 1
    real_model(kvsim, model)
    crafted(kvsim, workdir)
    for f in failures:
        print("FAIL:", f)
    print(f"gguf check: {0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
