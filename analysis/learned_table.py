#!/usr/bin/env python3
"""Tables of the learned-policy experiment (bench/learned_experiment.sh).

usage: learned_table.py DIR        (reads DIR/<mode>/sweep.csv and DIR/<mode>/verify.csv)

Per mode and budget, every policy's mean over the held-out requests: offline (the sweep's
teacher-forced attention KL and recall on the trace) and live (next-token KL against the full
cache, top-1 agreement, the task score and its share of the full-cache run's task score). A
learned policy is named by its method and model file (e.g. distillcache[distillcache_live]).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvsim_report.readers import read_records  # noqa: E402  (analysis/'s one reader)
from collections import defaultdict


def rows(path):
    return read_records(path)


def label(r):
    params = dict(p.split("=", 1) for p in r["params"].split(",") if "=" in p)
    if "model" in params:
        return f"{r['policy']}[{os.path.splitext(os.path.basename(params['model']))[0]}]"
    return r["policy"]


def num(text):
    try:
        return float(text)
    except ValueError:
        return float("nan")


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def table(mode_dir):
    offline = defaultdict(lambda: defaultdict(list))
    live = defaultdict(lambda: defaultdict(list))
    for r in rows(os.path.join(mode_dir, "sweep.csv")):
        key = (float(r["budget"]), label(r))
        offline[key]["kl"].append(float(r["mean_kl"]))
        offline[key]["recall"].append(float(r["mean_recall"]))
    verify = os.path.join(mode_dir, "verify.csv")
    if os.path.exists(verify):
        for r in rows(verify):
            key = (float(r["budget"]), label(r))
            live[key]["kl"].append(float(r["live_kl"]))
            live[key]["top1"].append(float(r["top1"]))
            task, ref = num(r["task_score"]), num(r["reference_task_score"])
            if task == task and ref == ref:  # text windows have no answer to score
                live[key]["task"].append(task)
                live[key]["ref_task"].append(ref)
    print("| budget | policy | offline KL | recall | live KL | top-1 | task | task / full cache |")
    print("|---|---|---|---|---|---|---|---|")
    for budget in sorted({b for b, _ in offline}):
        keys = sorted((k for k in offline if k[0] == budget),
                      key=lambda k: mean(live[k]["kl"]) if live[k]["kl"] else 1e9 + mean(offline[k]["kl"]))
        for k in keys:
            o, l = offline[k], live[k]
            ref = mean(l["ref_task"]) if l["ref_task"] else float("nan")
            share = mean(l["task"]) / ref if l["task"] and ref > 0 else float("nan")
            cells = [f"{budget:g}", k[1], f"{mean(o['kl']):.4f}", f"{mean(o['recall']):.3f}"]
            cells += [f"{mean(l['kl']):.4f}", f"{mean(l['top1']):.3f}", f"{mean(l['task']):.3f}", f"{share:.2f}"] if l["kl"] else ["—"] * 4
            print("| " + " | ".join(cells) + " |")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for mode in ("query-aware", "query-agnostic"):
        d = os.path.join(sys.argv[1], mode)
        if os.path.exists(os.path.join(d, "sweep.csv")):
            print(f"\n### {mode}\n")
            table(d)


if __name__ == "__main__":
    main()
