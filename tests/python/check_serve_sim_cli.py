#!/usr/bin/env python3
"""kvsim serve simulate end to end: a KV compression config read from a real sweep, its bytes ratio
and fidelity recomputed here from the sweep's rows; identical results on a rerun; compression moving
the hit rate; bad input refused with the file, line or flag named.

Usage: check_serve_sim_cli.py KVSIM OUTDIR
"""
import csv
import json
import os
import subprocess
import sys

from branching_trace import write_branching_trace

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def run(kvsim, *args, ok=True):
    p = subprocess.run([kvsim, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"kvsim {' '.join(args)} failed with {p.returncode}")
    return p


def write_trace(path):
    write_branching_trace(path, seed=3, n=300, max_new_blocks=4, ts_step=150, output=(1, 64))


def sweep_rows(path, policy, budget):
    with open(path) as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    return [r for r in rows if r["policy"] == policy and abs(float(r["budget"]) - budget) < 1e-9]


def main():
    kvsim, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    trace, h5, sweep = f"{out}/requests.jsonl", f"{out}/synth.h5", f"{out}/sweep.csv"
    write_trace(trace)
    run(kvsim, "trace", "synth", "-o", h5, "--force", "--requests", "2", "--context", "256")
    run(kvsim, "sweep", h5, "-p", "snapkv;kivi:bits=2;kivi:bits=4", "-b", "0.25,1", "-o", sweep, "--force", "--quiet")
    # Llama-2-7B's profile with 4 GB of KV space (15 full blocks) per instance: compression matters.
    args = ["serve", "simulate", trace, "--hbm-gb", "4", "--dram-gb", "8", "-e", "lru,rppc",
            "--kv-policy", "none;snapkv@0.25;kivi:bits=2@0.25", "--kv-results", sweep, "--quiet"]
    run(kvsim, *args, "-o", f"{out}/sim.csv", "--json", f"{out}/sim.json", "--force")
    run(kvsim, *args, "-o", f"{out}/sim2.csv", "--force")
    with open(f"{out}/sim.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    with open(f"{out}/sim2.csv") as f:
        rows2 = list(csv.DictReader(line for line in f if not line.startswith("#")))
    check(len(rows) == 6, f"6 rows (3 configs x 2 evictions), got {len(rows)}")
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]
    check(strip(rows) == strip(rows2), "a rerun gives identical results")
    summary = json.load(open(f"{out}/sim.json"))
    check(len(summary["results"]) == 6 and summary["profile"] == "llama2-7b-h100", "the JSON summary holds the rows")

    snap = sweep_rows(sweep, "snapkv", 0.25)
    ratio = sum(float(r["compressed_bytes"]) for r in snap) / sum(float(r["budget_bytes"]) / 0.25 for r in snap)
    kl = sum(float(r["mean_kl"]) for r in snap) / len(snap)
    by = {(r["kv_policy"], r["eviction"]): r for r in rows}
    s = by[("snapkv@0.25", "lru")]
    check(abs(float(s["kv_ratio"]) - ratio) < 1e-9, f"snapkv ratio {s['kv_ratio']} vs {ratio} from the sweep rows")
    check(abs(float(s["mean_kl"]) - kl) < 1e-9, f"snapkv mean_kl {s['mean_kl']} vs {kl}")
    check(s["kv_config"].startswith("snapkv:window="), f"the matched config is named: {s['kv_config']}")
    k2 = by[("kivi:bits=2@0.25", "lru")]
    check(0.2 < float(k2["kv_ratio"]) <= 0.25, f"KIVI-2 at matched bytes holds a quarter of fp16: {k2['kv_ratio']}")
    none = by[("none", "lru")]
    check(float(none["kv_ratio"]) == 1.0 and none["mean_kl"] == "", "the full cache: ratio 1, no fidelity")
    for name in ("snapkv@0.25", "kivi:bits=2@0.25"):
        c = by[(name, "lru")]
        check(float(c["hbm_share"]) > float(none["hbm_share"]), f"{name}: more HBM hits than the full cache")
        check(float(c["ttft_p50_ms"]) <= float(none["ttft_p50_ms"]), f"{name}: TTFT p50 no worse")
    for r in rows:
        check(int(r["completed"]) + int(r["rejected"]) == 300, "every request completes or is rejected")
        shares = sum(float(r[k]) for k in ("hbm_share", "dram_share", "ssd_share", "transition_share", "recompute_share"))
        check(abs(shares - 1) < 1e-9, "the ways add up to every block reference")

    # Everything rejected: no latency figures, written empty rather than as 0 ms.
    run(kvsim, "serve", "simulate", trace, "--hbm-gb", "0.0001", "--quiet", "-o", f"{out}/none.csv", "--force")
    with open(f"{out}/none.csv") as f:
        r = next(csv.DictReader(line for line in f if not line.startswith("#")))
    check(r["completed"] == "0" and r["rejected"] == "300", "all rejected at 0.1 MB of HBM")
    check(r["ttft_p50_ms"] == "" and r["tbt_p99_ms"] == "" and r["queue_p50_ms"] == "", "no samples: empty percentiles")

    def refused(what, pattern, *a):
        p = run(kvsim, *a, ok=False)
        check(p.returncode != 0 and pattern in p.stderr, f"{what}: exit {p.returncode}, stderr {p.stderr.strip()!r}")

    base = ["serve", "simulate", trace, "--quiet"]
    refused("ambiguous config", "matches more than one config", *base, "--kv-policy", "kivi@0.25", "--kv-results", sweep)
    refused("unmeasured config", "no row of", *base, "--kv-policy", "snapkv@0.5", "--kv-results", sweep)
    refused("no results file", "needs --kv-results", *base, "--kv-policy", "snapkv@0.25")
    refused("malformed spec", "expected POLICY", *base, "--kv-policy", "snapkv", "--kv-results", sweep)
    refused("not a results file", "has no column", *base, "--kv-policy", "snapkv@0.25", "--kv-results", trace)
    refused("zero HBM", "not a size in GB > 0", *base, "--hbm-gb", "0")
    refused("unknown eviction", "is unknown", *base, "-e", "fifo")
    refused("unknown router", "router 'x' is unknown", *base, "--route", "x")
    refused("tier without bandwidth", "--dram-gbps", *base, "--dram-gb", "4", "--dram-gbps", "0")
    bad = f"{out}/bad.jsonl"
    with open(trace) as f, open(bad, "w") as g:
        lines = f.readlines()
        lines[6] = lines[6].replace('"output_length"', '"output_len"')
        g.writelines(lines)
    refused("malformed line", "bad.jsonl:7", *["serve", "simulate", bad, "--quiet"])
    print("serve simulate cli:", "passed" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
