#!/usr/bin/env python3
"""Tables of the learned-policy experiment (bench/learned_experiment.sh).

usage: learned_table.py DIR      (reads DIR/<mode>/sweep.csv, the live runs DIR/<mode>/verify*.csv, DIR/families.txt)

Per mode and budget, every policy's means over the held-out requests: offline (the sweep's
teacher-forced attention KL and, when the sweep had an estimator, est_kl) and live (next-token KL
against the full cache, top-1 agreement, the task score and its share of the full-cache run's).
A learned policy is named by its method and model file (distillcache[distillcache_live]); its
models of several training seeds (DIR/<mode>/seed<k>/) are one row, whose live KL carries a 95%
confidence interval over the seeds (t distribution, each seed's mean over the requests). A policy
without seeds carries one over the requests instead: the "spread" column says which. A second
table repeats the figures on the families never seen in training (families.txt), and a third
compares the two DistillCache rewards seed by seed. The policies compared at the compression point
only (rlkv and KVzip, which peak semantics refuse, beside distillcache) have their own table from
DIR/<mode>/sweep_point.csv and verify_point*.csv.
"""
import glob
import math
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvsim_report.readers import read_records  # noqa: E402  (analysis/'s one reader)

# Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond the table).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    for k in sorted(T95):
        if df <= k:
            return T95[k]
    return 1.96


def num(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def mean(xs):
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def half_width(xs):
    xs = [x for x in xs if x == x]
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return t95(len(xs) - 1) * sd / math.sqrt(len(xs))


def label_and_seed(r):
    """The row's policy label and its training seed (None for a policy without a model file)."""
    params = dict(p.split("=", 1) for p in (r["params"] or "").split(",") if "=" in p)
    if "model" not in params:
        return r["policy"], None
    path = params["model"]
    seed = re.search(r"seed(\d+)", path)
    name = os.path.splitext(os.path.basename(path))[0]
    return f"{r['policy']}[{name}]", int(seed.group(1)) if seed else None


def family(request):
    """heldout-running-total-1 -> running-total."""
    body = request.split("-", 1)[1] if "-" in request else request
    return body.rsplit("-", 1)[0]


def unseen_families(out_dir):
    path = os.path.join(out_dir, "families.txt")
    if not os.path.exists(path):
        return set()
    for line in open(path):
        if line.startswith("unseen:"):
            return set(line.split(":", 1)[1].split())
    return set()


def gather(mode_dir, keep, suffix=""):
    """Per (budget, label): per seed, per request, the metrics of the rows `keep` admits (from
    sweep<suffix>.csv and the live runs in verify<suffix>.csv and verify<suffix>_b<budget>.csv)."""
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in read_records(os.path.join(mode_dir, f"sweep{suffix}.csv")):
        if not keep(r["request"]):
            continue
        label, seed = label_and_seed(r)
        cell = data[(float(r["budget"]), label)][seed][r["request"]]
        cell["offline"] = num(r["mean_kl"])
        cell["est"] = num(r.get("est_kl"))
    verify = [os.path.join(mode_dir, f"verify{suffix}.csv")]
    verify += sorted(glob.glob(os.path.join(mode_dir, f"verify{suffix}_b*.csv")))
    for r in (r for path in verify if os.path.exists(path) for r in read_records(path)):
        if not keep(r["request"]):
            continue
        label, seed = label_and_seed(r)
        cell = data[(float(r["budget"]), label)][seed][r["request"]]
        cell["live"] = num(r["live_kl"])
        cell["top1"] = num(r["top1"])
        cell["task"] = num(r["task_score"])
        cell["ref_task"] = num(r["reference_task_score"])
    return data


def summary(seeds, metric):
    """Mean over seeds of each seed's mean over requests, and the spread (95% CI half-width and what it is over)."""
    per_seed = [mean([c.get(metric, float("nan")) for c in reqs.values()]) for reqs in seeds.values()]
    if len(seeds) > 1:
        return mean(per_seed), half_width(per_seed), f"{len(per_seed)} seeds"
    reqs = next(iter(seeds.values()))
    values = [c.get(metric, float("nan")) for c in reqs.values()]
    return mean(values), half_width(values), f"{len([v for v in values if v == v])} requests"


def table(data):
    print("| budget | policy | offline KL | est KL | live KL ± 95% CI | spread | top-1 | task | task / full cache |")
    print("|---|---|---|---|---|---|---|---|---|")
    for budget in sorted({b for b, _ in data}):
        keys = [k for k in data if k[0] == budget]
        live = {k: summary(data[k], "live") for k in keys}
        keys.sort(key=lambda k: live[k][0] if live[k][0] == live[k][0] else 1e9 + summary(data[k], "offline")[0])
        for k in keys:
            seeds = data[k]
            m, h, spread = live[k]
            task, ref = summary(seeds, "task")[0], summary(seeds, "ref_task")[0]
            cells = [f"{budget:g}", k[1], f"{summary(seeds, 'offline')[0]:.4f}", f"{summary(seeds, 'est')[0]:.4f}"]
            if m == m:
                ci = f" ± {h:.4f}" if h == h else ""
                share = f"{task / ref:.2f}" if ref and ref > 0 and task == task else "—"
                task_text = f"{task:.3f}" if task == task else "—"
                cells += [f"{m:.4f}{ci}", spread, f"{summary(seeds, 'top1')[0]:.3f}", task_text, share]
            else:
                cells += ["—", "offline only", "—", "—", "—"]
            print("| " + " | ".join(c.replace("nan", "—") for c in cells) + " |")


def rewards(data):
    """DistillCache's two rewards, seed by seed: live KL of the trace-reward and live-reward models."""
    pairs = [(b, k) for b, k in data if k.startswith("distillcache[distillcache")]
    budgets = sorted({b for b, _ in pairs})
    if not budgets:
        return
    print("| budget | reward | live KL per seed | mean ± 95% CI |")
    print("|---|---|---|---|")
    for b in budgets:
        for name in ("distillcache[distillcache]", "distillcache[distillcache_live]"):
            seeds = data.get((b, name))
            if not seeds:
                continue
            per_seed = {s: mean([c.get("live", float("nan")) for c in reqs.values()]) for s, reqs in seeds.items()}
            shown = ", ".join(f"{s}: {v:.4f}" for s, v in sorted(per_seed.items(), key=lambda x: x[0] or 0))
            reward = "live" if name.endswith("_live]") else "trace (calibrated estimate)"
            print(f"| {b:g} | {reward} | {shown} | {mean(per_seed.values()):.4f} ± {half_width(per_seed.values()):.4f} |"
                  .replace("nan", "—"))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    unseen = unseen_families(out)
    for mode in ("query-aware", "query-agnostic"):
        d = os.path.join(out, mode)
        if not os.path.exists(os.path.join(d, "sweep.csv")):
            continue
        print(f"\n### {mode}: every held-out request\n")
        table(gather(d, lambda request: True))
        if unseen:
            print(f"\n### {mode}: families never seen in training ({', '.join(sorted(unseen))})\n")
            table(gather(d, lambda request: family(request) in unseen))
        print(f"\n### {mode}: DistillCache's trace and live rewards\n")
        rewards(gather(d, lambda request: True))
        if os.path.exists(os.path.join(d, "sweep_point.csv")):
            print(f"\n### {mode}: at the compression point only (rlkv, distillcache and KVzip, which cannot re-apply)\n")
            table(gather(d, lambda request: True, "_point"))


if __name__ == "__main__":
    main()
