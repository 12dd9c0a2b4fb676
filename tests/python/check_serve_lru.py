#!/usr/bin/env python3
"""kvsim serve hit-rate's LRU against an independent Python reference, exactly.

Definition (docs/serving.md): requests in file order; a request's hit is the longest run of its
hash_ids, from the first, that is cached; then its blocks are touched or inserted in order. Only
leaves (cached blocks with no cached child) may be evicted, the least recently used first, and
never a block the current request has touched. A request that cannot fit stops caching.

Usage: check_serve_lru.py KVSIM OUTDIR [MOONCAKE_TRACE]
Checks a generated branching trace always, and the shipped Mooncake sample too when it is given
and exists.
"""
import heapq
import json
import os
import subprocess
import sys

from branching_trace import write_branching_trace


def generated_trace(path):
    write_branching_trace(path, seed=5, n=400, max_new_blocks=5, ts_step=10, output=4)


def lru_reference(reqs, capacity):
    parent, last, kids = {}, {}, {}
    heap = []  # (last use, block): leaves, lazily invalidated
    hit_blocks = hit_tokens = 0
    for t, r in enumerate(reqs):
        ids, n = r["hash_ids"], r["input_length"]
        for i, b in enumerate(ids):
            parent.setdefault(b, ids[i - 1] if i else None)
        run = 0
        while run < len(ids) and ids[run] in last:
            run += 1
        hit_blocks += run
        hit_tokens += sum(512 if i + 1 < len(ids) else n - 512 * i for i in range(run))
        for b in ids:
            if b in last:
                last[b] = t
                if kids.get(b, 0) == 0:
                    heapq.heappush(heap, (t, b))
                continue
            held = []
            while len(last) >= capacity and heap:
                lt, v = heapq.heappop(heap)
                if v not in last or last[v] != lt or kids.get(v, 0) != 0:
                    continue
                if lt == t:
                    held.append((lt, v))
                    continue
                del last[v]
                p = parent[v]
                if p is not None:
                    kids[p] -= 1
                    if kids[p] == 0:
                        heapq.heappush(heap, (last[p], p))
            for e in held:
                heapq.heappush(heap, e)
            if len(last) >= capacity:
                break
            last[b] = t
            p = parent[b]
            if p is not None:
                kids[p] = kids.get(p, 0) + 1
            heapq.heappush(heap, (t, b))
    return hit_blocks, hit_tokens


def check(kvsim, trace, capacities, outdir, tag):
    reqs = [json.loads(line) for line in open(trace) if line.strip()]
    out = os.path.join(outdir, f"serve_lru_{tag}.json")
    subprocess.run([kvsim, "serve", "hit-rate", trace, "-c", ",".join(map(str, capacities)), "-e", "lru",
                    "--json", out, "--force"], check=True, stdout=subprocess.DEVNULL)
    got = json.load(open(out))
    distinct = len({b for r in reqs for b in r["hash_ids"]})
    refs = sum(len(r["hash_ids"]) for r in reqs)
    ok = True
    for row in got["results"]:
        want = lru_reference(reqs, row["capacity_blocks"])
        have = (row["hit_blocks"], row["hit_tokens"])
        print(f"{tag} lru capacity {row['capacity_blocks']}: kvsim {have}, reference {want}")
        ok &= have == want
    ceiling = (refs - distinct) / refs
    if abs(got["reuse_ceiling_blocks"] - ceiling) > 1e-12:
        print(f"{tag}: reuse ceiling {got['reuse_ceiling_blocks']} != {ceiling}")
        ok = False
    return ok


def main():
    kvsim, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    gen = os.path.join(outdir, "serve_generated.jsonl")
    generated_trace(gen)
    ok = check(kvsim, gen, [3, 20, 80, 300, 100000], outdir, "generated")
    if len(sys.argv) > 3 and os.path.exists(sys.argv[3]):
        ok &= check(kvsim, sys.argv[3], [1000, 5000, 10000, 20000, 50000], outdir, "mooncake")
    else:
        print("the Mooncake sample is not here: checked the generated trace only")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
