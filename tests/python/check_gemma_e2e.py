#!/usr/bin/env python3
"""Gemma 3 end to end: capture a needle task longer than the sliding window, check the trace,
sweep and verify the same configs. Offline and live count the same bytes for every config (the
local layers held at their window, the budget's rest on the global layers), the live run of the
full cache has zero KL, and a budget below the windows' share is refused naming it.

Usage: check_gemma_e2e.py KVSIM GEMMA.gguf OUTDIR
"""
import csv
import os
import subprocess
import sys


def run(*args, ok=True):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"{' '.join(args[:3])} ... failed with {p.returncode}")
    return p


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def main():
    kvsim, model, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    tasks, trace = f"{out}/tasks.jsonl", f"{out}/gemma.h5"
    run(kvsim, "tasks", "needle", "--out", tasks, "--count", "1", "--tokens", "800", "--force")
    run(kvsim, "capture", "-m", model, "-r", tasks, "-o", trace, "--force", "--queries", "eval", "--max-new", "8")
    info = run(kvsim, "trace", "info", trace).stdout
    failures = 0
    if "15 of 18 layers attend to the last 512 tokens" not in info:
        print("FAIL: trace info does not show the windows:\n" + info)
        failures += 1
    run(kvsim, "trace", "check", trace)
    policies, budgets = "full;snapkv;h2o:queries=recorded;streamingllm;kivi;varrate", "0.8,0.9"
    run(kvsim, "sweep", trace, "-p", policies, "-b", budgets, "-o", f"{out}/sweep.csv", "--force", "-q")
    run(kvsim, "verify", "-m", model, "-t", tasks, "-p", policies.replace(":queries=recorded", ""), "-b", budgets,
        "--max-new", "8", "-o", f"{out}/verify.csv", "--force", "-q")
    offline = {(r["policy"], float(r["budget"])): r for r in rows(f"{out}/sweep.csv")}
    live = {(r["policy"], float(r["budget"])): r for r in rows(f"{out}/verify.csv")}
    for key, r in sorted(live.items()):
        o = offline.get(key)
        if o is None:
            print(f"FAIL: {key} verified but not swept")
            failures += 1
            continue
        same = float(o["compressed_bytes"]) == float(r["compressed_bytes"]) and \
            abs(float(o["budget_bytes"]) - float(r["budget_bytes"])) < 1e-3
        print(f"{key[0]:13s} {key[1]:.2f}: bytes offline {float(o['compressed_bytes']):,.0f} live "
              f"{float(r['compressed_bytes']):,.0f} of {float(r['budget_bytes']):,.0f}; live KL {float(r['live_kl']):.4f}")
        if not same or float(r["compressed_bytes"]) > float(r["budget_bytes"]) + 1e-6:
            print(f"FAIL: {key}: offline and live bytes differ or exceed the budget")
            failures += 1
        if key[0] == "full" and float(r["live_kl"]) > 1e-9:
            print(f"FAIL: the full cache's live KL is {r['live_kl']}")
            failures += 1
    low = run(kvsim, "sweep", trace, "-p", "snapkv", "-b", "0.5", "-o", f"{out}/low.csv", "--force", "-q", ok=False)
    if low.returncode == 0 or "sliding-window layers alone hold" not in low.stderr:
        print(f"FAIL: budget 0.5 not refused: {low.stderr.strip()}")
        failures += 1
    print("gemma end to end:", "passed" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
