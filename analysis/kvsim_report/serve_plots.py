"""Serving: hit rate against capacity per eviction policy, and TTFT CDFs, with and without KV
compression (kvsim serve hit-rate / simulate)."""
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .plots import Figure

STYLES = ["-", "--", ":", "-."]


def hit_rate_curves(inputs):
    figs = []
    for df in inputs.serve_hits:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for ev, sub in df.groupby("eviction"):
            sub = sub.sort_values("capacity_blocks")
            ax.plot(sub["capacity_blocks"], sub["block_hit_rate"], marker="o", label=ev)
        if "reuse_ceiling_blocks" in df:
            ax.axhline(float(df["reuse_ceiling_blocks"].iloc[0]), color="gray", ls=":", label="reuse ceiling")
        ax.set_xscale("log")
        ax.set_xlabel("capacity (blocks)")
        ax.set_ylabel("block hit rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs.append(Figure("serve_hit_rate", "Hit rate against capacity", "Prefix-cache block hit rate per eviction "
                           "policy (no timing): the higher curve keeps more of what is reused; the dotted line is the "
                           "most any policy can reach.", fig))
    for df in inputs.serve_sim:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        kvs = list(dict.fromkeys(df["kv_policy"]))
        for (ev, kv), sub in df.groupby(["eviction", "kv_policy"], sort=False):
            sub = sub.sort_values("hbm_gb")
            ax.plot(sub["hbm_gb"], sub["hit_rate"], marker="o", ls=STYLES[kvs.index(kv) % 4], label=f"{ev}, kv {kv}")
        ax.set_xlabel("HBM KV space per instance (GB)")
        ax.set_ylabel("hit rate (blocks not recomputed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs.append(Figure("serve_sim_hit_rate", "Timed simulation: hit rate against HBM",
                           "Share of prompt blocks served from a cache tier or a transition per eviction policy; line "
                           "style by KV compression config: compression shifts the curve up by fitting more blocks.", fig))
        cdf = ttft_cdf(df)
        if cdf:
            figs.append(cdf)
    return figs


def ttft_cdf(df):
    """TTFT CDFs at one HBM size (the largest), from the JSON summary's centiles."""
    if "ttft_centiles_ms" not in df:
        return None
    at = df[df["hbm_gb"] == df["hbm_gb"].max()]
    at = at[at["ttft_centiles_ms"].map(lambda c: isinstance(c, list) and len(c) > 1)]
    if at.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    kvs = list(dict.fromkeys(at["kv_policy"]))
    for _, r in at.iterrows():
        c = np.asarray(r["ttft_centiles_ms"], dtype=float)
        ax.plot(np.maximum(c, 1e-3), np.linspace(0, 1, len(c)), ls=STYLES[kvs.index(r["kv_policy"]) % 4],
                label=f"{r['eviction']}, kv {r['kv_policy']}")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("share of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"TTFT CDF at {at['hbm_gb'].iloc[0]:g} GB of HBM")
    fig.tight_layout()
    return Figure("serve_ttft_cdf", "TTFT distribution", "Share of requests whose first token came within a given "
                  "time: a curve further left serves faster; compare the tails, where long prompts sit.", fig)


def training_curves(inputs):
    figs = []
    for m in inputs.models:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ax.plot(m["step"], m["value"], lw=1)
        if len(m["value"]) > 20:
            w = max(5, len(m["value"]) // 20)
            ax.plot(m["step"][w - 1:], pd.Series(m["value"]).rolling(w).mean().dropna(), lw=2, label=f"mean of {w}")
            ax.legend(fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylabel(m["metric"] or "value")
        ax.grid(alpha=0.3)
        where = os.path.basename(os.path.dirname(os.path.abspath(m["path"])))
        ax.set_title(f"{m['method']} training ({where}): {m['metric']}")
        fig.tight_layout()
        figs.append(Figure(f"training_{m['method']}", f"Training curve: {m['method']} ({where})",
                           f"The {m['metric']} recorded while training {m['path']}: it should settle; a curve still "
                           f"falling at the end means more steps would help.", fig))
    return figs
