#!/usr/bin/env python3
"""A kvtrace file is standard HDF5: h5py opens it, K/V/Q are numpy float16, and the values
equal what kvsim's own reader returns (`kvsim trace dump`). Its chunk checksums are the library's
Fletcher32 both ways: stock HDF5 (under h5py) verifies what kvsim wrote, and kvsim verifies
chunks the stock library wrote, and catches one it damaged."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np


def main() -> int:
    kvsim, workdir = sys.argv[1], sys.argv[2]
    path = os.path.join(workdir, "h5py_check.h5")
    subprocess.run([kvsim, "trace", "synth", "-o", path, "--force", "--layers", "3", "--context", "96",
                    "--needle", "8", "--requests", "2", "--queries", "eval", "--seed", "5"],
                   check=True, stdout=subprocess.DEVNULL)
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    with h5py.File(path, "r") as f:
        expect(f.attrs["format"].decode() == "kvtrace", "root attribute format")
        expect(int(f.attrs["version"]) == 1, "root attribute version")
        model = f["model"].attrs
        L, hkv, hq, d = (int(model[k]) for k in ("n_layers", "n_kv_heads", "n_q_heads", "head_dim"))
        expect((L, hkv, hq, d) == (3, 3, 9, 64), f"model geometry {(L, hkv, hq, d)}")
        expect(json.loads(f["capture"].attrs["config"])["seed"] == 5, "seed in capture config")
        for rid in ("r0", "r1"):
            req = f["requests"][rid]
            expect(req.attrs["status"].decode() == "complete", f"{rid} status")
            T = req["tokens"].shape[0]
            Tq = req["q_index"].shape[0]
            for name, heads, rows in (("k", hkv, T), ("v", hkv, T), ("q", hq, Tq)):
                ds = req[name]
                expect(ds.dtype == np.float16, f"{rid}/{name} dtype {ds.dtype}")
                expect(ds.shape == (L, rows, heads, d), f"{rid}/{name} shape {ds.shape}")
                expect(ds.chunks == (1, rows, heads, d), f"{rid}/{name} chunks {ds.chunks}")
                for layer in range(L):
                    out = subprocess.run([kvsim, "trace", "dump", path, "--request", rid, "--tensor", name,
                                          "--layer", str(layer)], check=True, capture_output=True, text=True)
                    ours = np.array(json.loads(out.stdout)["values"], dtype=np.float32)
                    theirs = ds[layer].astype(np.float32).reshape(-1)
                    expect(np.array_equal(ours, theirs), f"{rid}/{name} layer {layer} values differ")
            ref = req["ref"]
            expect(ref["topk_logp"].dtype == np.float32, "ref/topk_logp dtype")
            expect(bool(np.all(np.diff(ref["index"][:]) > 0)), "ref/index increasing")
            expect(bool(np.all(np.isfinite(req["k"][:]))), f"{rid}/k finite")
            expect(all(req[n].fletcher32 for n in ("k", "v", "q", "tokens", "q_index")), f"{rid} checksummed")

    # The stock library re-writes every tensor with its own Fletcher32; kvsim reads them checked.
    restamped = os.path.join(workdir, "h5py_restamped.h5")
    with h5py.File(path, "r") as src, h5py.File(restamped, "w") as dst:
        for key in src.attrs:
            dst.attrs[key] = src.attrs[key]
        for name in ("model", "capture"):
            src.copy(name, dst)
        for rid in ("r0", "r1"):
            g = dst.create_group(f"requests/{rid}")
            for key, value in src["requests"][rid].attrs.items():
                g.attrs[key] = value
            for name, obj in src["requests"][rid].items():
                if isinstance(obj, h5py.Group):
                    src["requests"][rid].copy(name, g)
                else:
                    g.create_dataset(name, data=obj[()], chunks=obj.chunks, fletcher32=True)
    check = subprocess.run([kvsim, "trace", "check", restamped], capture_output=True, text=True)
    expect(check.returncode == 0 and "OK" in check.stdout, f"kvsim reads stock checksums: {check.stderr.strip()}")
    with h5py.File(restamped, "r") as f:
        offset = f["requests/r1/v"].id.get_chunk_info_by_coord((2, 0, 0, 0)).byte_offset
    with open(restamped, "r+b") as io:
        io.seek(offset + 5)
        byte = io.read(1)[0]
        io.seek(offset + 5)
        io.write(bytes([byte ^ 0x20]))
    check = subprocess.run([kvsim, "trace", "check", restamped], capture_output=True, text=True)
    expect(check.returncode == 1 and "request 'r1' dataset 'v': reading layer 2" in check.stderr,
           f"kvsim catches a damaged stock chunk: {check.stderr.strip()}")
    for f in failures:
        print("FAIL:", f)
    print(f"h5py check: {0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
