"""A Mooncake-format request trace of branching conversations, for the serving tests: each request
extends a prefix of an earlier one (70%) or starts anew, then adds 1..max_new_blocks new 512-token
blocks. Deterministic for its arguments."""
import json
import random


def write_branching_trace(path, seed, n, max_new_blocks, ts_step, output):
    """`output`: every request's output_length, or (lo, hi) to draw it after the request's blocks."""
    rng = random.Random(seed)
    reqs, nxt = [], 0
    for i in range(n):
        ids = []
        if reqs and rng.random() < 0.7:
            base = rng.choice(reqs)["hash_ids"]
            ids = base[: rng.randint(1, len(base))]
        for _ in range(rng.randint(1, max_new_blocks)):
            ids.append(nxt)
            nxt += 1
        out = output if isinstance(output, int) else rng.randint(*output)
        reqs.append({"timestamp": i * ts_step, "input_length": 512 * len(ids), "output_length": out, "hash_ids": ids})
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
