#!/usr/bin/env python3
"""Writes the hostile traces: the smallest trace kvsim's writer makes (`kvsim trace synth`, 57 KB,
nearly all HDF5 metadata) with one byte of its metadata changed, each a change on which HDF5 1.10
itself crashes or reads out of bounds when the file is read unprotected. fuzz_trace_hdf5 found them
(docs/fuzzing.md); each was reduced to the one byte that matters by delta debugging against the
unprotected reads. They are made here rather than kept as files: nothing but the offsets is data.

usage: make_hostile_traces.py KVSIM OUT_DIR
"""
import pathlib
import re
import subprocess
import sys

TINY = ["--layers", "1", "--q-heads", "1", "--kv-heads", "1", "--head-dim", "16", "--vocab", "16", "--requests", "1",
        "--system", "1", "--context", "4", "--question", "1", "--generated", "1", "--needle", "1", "--ref-topk", "1"]

# name: (offset, byte), what ASan reported inside HDF5 when the file was read unprotected.
HOSTILE = {
    "cache_alloc_oom": (140, 10),        # allocator out of memory in H5C_protect
    "cache_huge_request": (1111, 41),    # an allocation of terabytes requested in H5C_protect
    "heap_overflow": (22423, 32),        # heap-buffer-overflow inside HDF5
    "memcpyvv_overflow": (22836, 246),   # heap-buffer-overflow in H5VM_memcpyvv
    "segv": (2503, 248),                 # SEGV inside HDF5
}


# The seed as it was when they were found: its capture date, and the modification time HDF5 keeps
# in every object header (the crashes depend on those bytes too: a fresh seed's differ).
FOUND_DATE = b"2026-12-07T15:31:55Z"
OBJECT_TIMES = (22948, 25676, 28076, 30455, 32919, 33191, 33463, 46203, 48927, 51835, 54719)
FOUND_TIME = bytes.fromhex("6bd1166b")  # little-endian seconds since 1970
# The offsets past the /requests name heap moved by 16296 bytes when the writer sized that heap up
# front; every input was checked to crash HDF5 again at its moved offset.


def pinned(data):
    """The seed with its date and object times set to those of the seed the crashes were found on."""
    m = re.search(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data)
    if not m or len(data) != 56919:
        sys.exit("make_hostile_traces: the seed trace is not the one the inputs were found on (56919 bytes, one "
                 "capture date): the writer's layout changed; find them again with fuzz_trace_hdf5")
    out = bytearray(data)
    out[m.start():m.end()] = FOUND_DATE
    for at in OBJECT_TIMES:
        out[at:at + 4] = FOUND_TIME
    return out


def main():
    kvsim, out = sys.argv[1], pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    seed = out / "seed.h5"
    subprocess.run([kvsim, "trace", "synth", "-o", str(seed), "--force", *TINY], check=True, capture_output=True)
    data = pinned(seed.read_bytes())
    seed.unlink()
    for name, (offset, byte) in HOSTILE.items():
        changed = bytearray(data)
        changed[offset] = byte
        (out / f"{name}.h5").write_bytes(bytes(changed))
    print(f"hostile traces: {len(HOSTILE)} written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
