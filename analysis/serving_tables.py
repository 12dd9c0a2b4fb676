#!/usr/bin/env python3
"""Tables of the serving experiment (bench/serving_experiment.sh, docs/experiments/serving.md).

usage: serving_tables.py DIR        (reads the `kvsim serve simulate` CSVs the script leaves in DIR)

Every row is one simulation of the whole Mooncake sample: hit rate = block references not
recomputed (HBM hits, DRAM or SSD loads, transitions), TTFT and queueing from arrival, time between
tokens per decode step, throughput in generated tokens per second of simulated time.
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvsim_report.readers import read_records  # noqa: E402  (analysis/'s one reader)


def rows(path):
    return read_records(path)


def f(x, digits=3):
    if x in ("", None):
        return "-"
    v = float(x)
    return f"{v:.{digits}f}" if abs(v) < 1000 else f"{v:,.0f}"


def ms(x):
    v = float(x)
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def capacity_table(path):
    print("### Hit rate and TTFT against HBM size, per eviction policy\n")
    print("| eviction | HBM GB | done | hit rate | from HBM | from DRAM | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | queue p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows(path):
        print(f"| {r['eviction']} | {f(r['hbm_gb'], 0)} | {r['completed']} | {f(r['hit_rate'])} | {f(r['hbm_share'])} | {f(r['dram_share'])} | "
              f"{ms(r['ttft_p50_ms'])} | {ms(r['ttft_p90_ms'])} | {ms(r['ttft_p99_ms'])} | {ms(r['queue_p99_ms'])} |")
    print()


def compression_table(path, title):
    print(f"### {title}\n")
    print("| KV config | ratio | eviction | HBM GB | done | hit rate | from HBM | TTFT p50 ms | TTFT p99 ms | TBT p50 ms | "
          "tokens/s | offline KL | live KL | live top-1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows(path):
        print(f"| {r['kv_policy']} | {f(r['kv_ratio'])} | {r['eviction']} | {f(r['hbm_gb'], 0)} | {r['completed']} | "
              f"{f(r['hit_rate'])} | "
              f"{f(r['hbm_share'])} | {ms(r['ttft_p50_ms'])} | {ms(r['ttft_p99_ms'])} | {f(r['tbt_p50_ms'], 2)} | "
              f"{f(r['throughput_tokens_s'], 0)} | {f(r['mean_kl'])} | {f(r['live_kl'])} | {f(r['top1'], 2)} |")
    print()


def transitions_table(d):
    paths = sorted(glob.glob(os.path.join(d, "transitions_*.csv")))
    if not paths:
        return
    print("### Transitions (HBM 64 GB), per assumed diff share\n")
    print("Materialisation cost summed over requests, as planned (before link queueing): the chosen ways against "
          "recompute-only (every block outside HBM recomputed) and load-only (every cached block loaded).\n")
    print("| diff | eviction | transition share | DRAM share | hit rate | planned s | recompute-only s | load-only s | "
          "saved vs recompute | saved vs load | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        diff = os.path.basename(p)[len("transitions_"):-len(".csv")]
        for r in rows(p):
            planned, rec, load = (float(r[k]) / 1e3 for k in ("planned_ms", "recompute_only_ms", "load_only_ms"))
            print(f"| {diff} | {r['eviction']} | {f(r['transition_share'])} | {f(r['dram_share'])} | {f(r['hit_rate'])} | "
                  f"{planned:,.0f} | {rec:,.0f} | {load:,.0f} | {100 * (1 - planned / rec):.1f}% | "
                  f"{100 * (1 - planned / load):.1f}% | {ms(r['ttft_p50_ms'])} | {ms(r['ttft_p99_ms'])} |")
    print()


def main():
    d = sys.argv[1]
    capacity_table(os.path.join(d, "capacity.csv"))
    hbm_only = os.path.join(d, "hbm_only.csv")
    if os.path.exists(hbm_only):
        print("### Without the DRAM tier\n")
        print("| eviction | HBM GB | done | hit rate | TTFT p50 ms | TTFT p99 ms | queue p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for r in rows(hbm_only):
            print(f"| {r['eviction']} | {f(r['hbm_gb'], 0)} | {r['completed']} | {f(r['hit_rate'])} | {ms(r['ttft_p50_ms'])} | "
                  f"{ms(r['ttft_p99_ms'])} | {ms(r['queue_p99_ms'])} |")
        print()
    compression_table(os.path.join(d, "compression.csv"), "With KV compression (fidelity measured on SmolLM2, query-agnostic)")
    transitions_table(d)
    for name, title in (("overload.csv", "Overload (arrivals 2x): compression"),
                        ("overload_transitions.csv", "Overload (arrivals 2x): transitions, diff 0.25")):
        if os.path.exists(os.path.join(d, name)):
            compression_table(os.path.join(d, name), title)


if __name__ == "__main__":
    main()
