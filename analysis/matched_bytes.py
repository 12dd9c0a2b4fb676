#!/usr/bin/env python3
"""Tables of the matched-bytes experiment (bench/matched_bytes.sh) and the three seed claims.

usage: matched_bytes.py DIR        (reads DIR/<mode>/sweep*.csv and DIR/<mode>/verify*.csv)

Every number is a mean over the experiment's requests of one (mode, policy, budget) config:
offline = the sweep's teacher-forced per-layer metrics on the trace, live = the model run on the
really compressed cache (KL(full || compressed) of the next-token distributions, top-1 agreement,
RULER string-match task score on the free-running answer).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvsim_report.readers import read_records  # noqa: E402  (analysis/'s one reader)
from collections import defaultdict

TOKEN_SELECTION = ["streamingllm", "snapkv", "pyramidkv", "adakv", "h2o", "tova", "expected_attention", "keydiff", "andpro",
                   "kvzip", "kvzip_proxy", "structure"]
KEEP_EVERY_TOKEN = ["intn", "kivi", "lowrank", "varrate"]


def rows(path):
    return read_records(path)


def labels(records):
    """policy plus the parameters that tell its configs apart (e.g. intn bits=2 vs bits=4)."""
    by_policy = defaultdict(set)
    for r in records:
        by_policy[r["policy"]].add(r["params"])
    out = {}
    for policy, variants in by_policy.items():
        parsed = {v: dict(kv.split("=", 1) for kv in v.split(",") if "=" in kv) for v in variants}
        keys = {k for p in parsed.values() for k in p}
        differ = sorted(k for k in keys if len({p.get(k) for p in parsed.values()}) > 1)
        for v, p in parsed.items():
            extra = ",".join(f"{k}={p.get(k)}" for k in differ)
            out[(policy, v)] = policy + (f":{extra}" if extra else "")
    return out


def mean(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def load(out):
    table = {}  # (mode, label, budget) -> metrics
    semantics = set()
    modes = []
    for mode in ("query-aware", "query-agnostic"):
        # sweep*.csv / verify*.csv: later runs of extra policies (e.g. sweep_kvzip.csv) join the table.
        folder = os.path.join(out, mode)
        names_in = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        sweeps = [os.path.join(folder, f) for f in names_in if f.startswith("sweep") and f.endswith(".csv")]
        lives = [os.path.join(folder, f) for f in names_in if f.startswith("verify") and f.endswith(".csv")]
        if not sweeps:  # a mode whose live runs are missing still gets its offline columns
            continue
        modes.append(mode)
        sweep = [r for path in sweeps for r in rows(path)]
        live = [r for path in lives for r in rows(path)]
        names = labels(sweep + live)
        acc = defaultdict(lambda: defaultdict(list))
        for r in sweep:
            key = (mode, names[(r["policy"], r["params"])], float(r["budget"]))
            acc[key]["off_kl"].append(float(r["mean_kl"]))
            acc[key]["off_err"].append(float(r["mean_out_err"]))
            acc[key]["kept"].append(float(r["kept_fraction"]))
            acc[key]["bytes"].append(float(r["compressed_bytes"]) / float(r["budget_bytes"]))
            if r.get("decode_peak_bytes"):  # the most held at any step, against the same budget
                acc[key]["peak"].append(float(r["decode_peak_bytes"]) / float(r["budget_bytes"]))
            if r.get("budget_semantics"):
                semantics.add(r["budget_semantics"])
        for r in live:
            key = (mode, names[(r["policy"], r["params"])], float(r["budget"]))
            acc[key]["live_kl"].append(float(r["live_kl"]))
            acc[key]["top1"].append(float(r["top1"]))
            acc[key]["task"].append(float(r["task_score"]) if r["task_score"] not in ("", "nan") else float("nan"))
            acc[key]["ref_task"].append(float(r["reference_task_score"]) if r["reference_task_score"] not in ("", "nan")
                                        else float("nan"))
        for key, m in acc.items():
            table[key] = {k: float("nan") for k in ("live_kl", "top1", "task", "ref_task", "peak")}
            table[key].update({k: mean(v) for k, v in m.items()})
            table[key]["n"] = len(m["off_kl"])
    return modes, table, semantics


def fmt(x, digits=3):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: matched_bytes.py OUT")
    modes, t, semantics = load(sys.argv[1])
    if not t:
        sys.exit(f"no sweep*.csv + verify*.csv under {sys.argv[1]}/<mode>/")
    budgets = sorted({b for (_, _, b) in t})
    policies = sorted({p for (_, p, _) in t}, key=lambda p: (p.split(":")[0] not in TOKEN_SELECTION, p))
    n = max(v["n"] for v in t.values())
    ref = mean([v.get("ref_task", float("nan")) for v in t.values()])
    print(f"# Matched-bytes experiment: {n} requests, budgets {', '.join(map(str, budgets))}, modes {', '.join(modes)}\n")
    print(f"Budget semantics: {', '.join(sorted(semantics)) or 'point'} (docs/budget_semantics.md). "
          f"Full-cache task score (reference): {fmt(ref)}. Byte budgets are fractions of the full fp16 cache at the "
          "compression point; `bytes` is compressed / budget bytes right after compression, `peak` the most the cache "
          "held at any later step / budget bytes, `kept` the share of tokens kept in any form.\n")
    for mode in modes:
        print(f"## {mode}\n")
        print("| policy | budget | kept | bytes | peak | offline KL | offline err | live KL | top-1 | task |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for p in policies:
            for b in budgets:
                v = t.get((mode, p, b))
                if not v:
                    continue
                print(f"| {p} | {b:g} | {fmt(v['kept'], 2)} | {fmt(v['bytes'], 2)} | {fmt(v['peak'], 2)} | "
                      f"{fmt(v['off_kl'], 4)} | {fmt(v['off_err'], 3)} | {fmt(v['live_kl'], 4)} | "
                      f"{fmt(v['top1'], 3)} | {fmt(v['task'], 2)} |")
        print()

    def live(mode, p, b, key="live_kl"):
        v = t.get((mode, p, b))
        return v[key] if v else float("nan")

    print("## Claim 1: query-agnostic reuse hurts token selection more than keeping every token\n")
    if len(modes) == 2:
        print("Mean over budgets of live KL (and offline KL) in each mode; the ratio agnostic / aware.\n")
        print("| policy | kind | live KL aware | live KL agnostic | ratio | offline KL aware | offline KL agnostic | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        groups = defaultdict(list)
        for p in policies:
            base = p.split(":")[0]
            kind = "token selection" if base in TOKEN_SELECTION else "every token" if base in KEEP_EVERY_TOKEN else "tiers"
            la, lg = mean([live(modes[0], p, b) for b in budgets]), mean([live(modes[1], p, b) for b in budgets])
            oa = mean([live(modes[0], p, b, "off_kl") for b in budgets])
            og = mean([live(modes[1], p, b, "off_kl") for b in budgets])
            groups[kind].append((lg / la if la > 0 else float("nan"), og / oa if oa > 0 else float("nan")))
            print(f"| {p} | {kind} | {fmt(la, 4)} | {fmt(lg, 4)} | {fmt(lg / la if la > 0 else float('nan'), 2)} | "
                  f"{fmt(oa, 4)} | {fmt(og, 4)} | {fmt(og / oa if oa > 0 else float('nan'), 2)} |")
        print()
        for kind, rs in groups.items():
            print(f"- {kind}: mean live ratio {fmt(mean([r[0] for r in rs]), 2)}, "
                  f"mean offline ratio {fmt(mean([r[1] for r in rs]), 2)}")
        print()
    else:
        print("(needs both modes)\n")

    def versus(title, a, b_):
        print(f"## {title}\n")
        print(f"| mode | budget | {a} live KL | {b_} live KL | {a} offline KL | {b_} offline KL | {a} task | {b_} task |")
        print("|---|---|---|---|---|---|---|---|")
        wins = total = 0
        for mode in modes:
            for b in budgets:
                x, y = live(mode, a, b), live(mode, b_, b)
                if math.isnan(x) or math.isnan(y):
                    continue
                total += 1
                wins += x < y
                print(f"| {mode} | {b:g} | {fmt(x, 4)} | {fmt(y, 4)} | {fmt(live(mode, a, b, 'off_kl'), 4)} | "
                      f"{fmt(live(mode, b_, b, 'off_kl'), 4)} | {fmt(live(mode, a, b, 'task'), 2)} | "
                      f"{fmt(live(mode, b_, b, 'task'), 2)} |")
        print(f"\n{a} has the lower live KL in {wins} of {total} (mode, budget) cells.\n")

    versus("Claim 2: variable rank against uniform rank at the same bytes", "varrate", "lowrank")
    qe = [p for p in policies if p.startswith("qevict")]
    three = next((p for p in qe if "hi_share=1" not in p), None)
    two = next((p for p in qe if "hi_share=1" in p), None)
    if three and two:
        versus("Claim 3: three tiers (fp16 / int4 / deleted) against two (keep / drop), same scorer and windows", three, two)
        versus("Claim 3, second baseline: three tiers against SnapKV eviction", three, "snapkv")


if __name__ == "__main__":
    main()
