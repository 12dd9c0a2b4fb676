"""The report's figures, one function each. Every function returns a list of Figure: a matplotlib
figure, a file stem and a one-line caption saying what to read from it."""
import math
from dataclasses import dataclass

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from .readers import InputError, config_means  # noqa: E402

FAMILIES = {
    "token selection": ["streamingllm", "snapkv", "pyramidkv", "adakv", "h2o", "tova", "expected_attention", "keydiff",
                        "andpro", "kvzip", "kvzip_proxy", "random", "structure"],
    "quantized": ["intn", "kivi", "qevict"],
    "low rank": ["lowrank", "lowrank_uniform", "varrate"],
    "learned": ["foresight", "sigmoid_gate", "distillcache", "rlkv"],
}
FAMILY_COLOURS = {"token selection": "tab:blue", "quantized": "tab:orange", "low rank": "tab:green",
                  "learned": "tab:purple", "oracle": "tab:gray", "full cache": "black", "other": "tab:brown"}
SEGMENTS = ["system", "context", "question", "generated"]
SEGMENT_COLOURS = {"system": "#9e9e9e", "context": "#90caf9", "question": "#ffcc80", "generated": "#a5d6a7",
                   "needle": "#e53935"}


@dataclass
class Figure:
    stem: str
    title: str
    caption: str
    fig: object


def family(policy):
    if policy == "full":
        return "full cache"
    if policy.startswith("oracle"):
        return "oracle"
    for name, members in FAMILIES.items():
        if policy in members:
            return name
    return "other"


def short_label(policy, params):
    """The policy plus the parameters that usually tell configs apart (bits, base, model)."""
    keep = [kv for kv in str(params).split(",")
            if kv.split("=")[0] in ("bits", "base", "sign", "hi_share", "soft", "gqa", "model")]
    return policy + (":" + ",".join(keep) if keep else "")


def frontier(points, lower=True):
    """The Pareto frontier of (bytes, value) points: fewer bytes and lower (or higher) value."""
    best = math.inf if lower else -math.inf
    out = []
    # At equal bytes the better value comes first, so a worse twin is never on the frontier.
    for x, y in sorted(points, key=lambda p: (p[0], p[1] if lower else -p[1])):
        if (y < best) if lower else (y > best):
            out.append((x, y))
            best = y
    return out


def _scatter_families(ax, df, ycol):
    for fam, colour in FAMILY_COLOURS.items():
        sub = df[df["policy"].map(family) == fam]
        if len(sub):
            ax.scatter(sub["bytes_ratio"], sub[ycol], s=28, c=colour, label=fam, alpha=0.85, edgecolors="none")


def _frontier_panel(ax, means, ycol, ylabel, lower):
    d = means.dropna(subset=[ycol])
    _scatter_families(ax, d, ycol)
    f = frontier(list(zip(d["bytes_ratio"], d[ycol])), lower)
    if f:
        ax.step([p[0] for p in f], [p[1] for p in f], where="post", color="crimson", lw=1.2, label="frontier")
        for x, y in f:
            row = d[(d["bytes_ratio"] == x) & (d[ycol] == y)].iloc[0]
            ax.annotate(short_label(row["policy"], row["params"]), (x, y), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("KV bytes / full cache")
    ax.set_ylabel(ylabel)
    if lower and (d[ycol] > 0).any():
        ax.set_yscale("symlog", linthresh=max(1e-4, float(d.loc[d[ycol] > 0, ycol].min())))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def pareto_frontiers(inputs):
    """Bytes against live KL and task score per mode; against the offline estimate where no live
    run exists."""
    figs = []
    live = pd.concat(inputs.verify) if inputs.verify else None
    offline = pd.concat(inputs.sweep) if inputs.sweep else None
    modes = sorted(set(live["mode"]) if live is not None else set()) + \
        sorted(set(offline["mode"]) - set(live["mode"]) if live is not None and offline is not None
               else set(offline["mode"]) if offline is not None else set())
    for mode in modes:
        if live is not None and mode in set(live["mode"]):
            means = config_means(live[live["mode"] == mode], ["live_kl", "task_score"])
            has_task = "task_score" in means and means["task_score"].notna().any()
            fig, axes = plt.subplots(1, 2 if has_task else 1, figsize=(11 if has_task else 6.5, 4.5), squeeze=False)
            _frontier_panel(axes[0][0], means, "live_kl", "live KL (full ‖ compressed)", True)
            if has_task:
                _frontier_panel(axes[0][1], means, "task_score", "task score", False)
            what, source = "live KL" + (" and task score" if has_task else ""), "verify"
        else:
            d = offline[offline["mode"] == mode]
            ycol = "est_kl" if "est_kl" in d and d["est_kl"].notna().any() else "mean_kl"
            means = config_means(d, [ycol])
            fig, axes = plt.subplots(1, 1, figsize=(6.5, 4.5), squeeze=False)
            _frontier_panel(axes[0][0], means, ycol, "offline estimate of live KL" if ycol == "est_kl" else "offline KL",
                            True)
            what, source = "the offline " + ("estimate" if ycol == "est_kl" else "KL"), "sweep (no live run)"
        fig.suptitle(f"Pareto frontier, {mode}")
        fig.tight_layout()
        figs.append(Figure(f"frontier_{mode}", f"Pareto frontier ({mode})",
                           f"Bytes kept against {what} per config ({source}, means over requests); the red steps are "
                           f"the configs no other beats on both: pick from them.", fig))
    return figs


def _pick_config(detail, sweep, wanted):
    """The detail rows of one config: `wanted` (LABEL@BUDGET), else the offline-best deployable
    config (not the full cache, not an oracle) at the smallest budget."""
    d = detail[(detail["policy"] != "full") & ~detail["policy"].str.startswith("oracle")]
    if d.empty:
        raise InputError(f"{detail.attrs['path']}: only full-cache or oracle rows; the heatmap needs a deployable config")
    if wanted:
        label, _, budget = wanted.rpartition("@")
        try:
            budget = float(budget)
        except ValueError:
            raise InputError(f"--config {wanted}: expected LABEL@BUDGET with a number after '@'") from None
        sel = d[(d["policy"] == label) & (np.isclose(d["budget"].astype(float), budget))] if label else d.iloc[0:0]
        if sel.empty:
            raise InputError(f"--config {wanted}: no detail rows of this config; the detail has: "
                             + ", ".join(sorted({f'{p}@{b:g}' for p, b in zip(d['policy'], d['budget'])})[:12]))
        return sel, label, budget
    b = d["budget"].min()
    at = d[d["budget"] == b]
    best = at.assign(kl=at["layer_kl"].map(np.mean)).groupby("policy")["kl"].mean().idxmin()
    return at[at["policy"] == best], best, b


def head_heatmaps(inputs, wanted=None):
    figs = []
    for detail in inputs.detail:
        rows, label, budget = _pick_config(detail, inputs.sweep, wanted)
        per_head = "head_kl" in rows.columns and rows["head_kl"].notna().all()
        grid = np.mean([np.asarray(h, dtype=float) for h in (rows["head_kl"] if per_head else rows["layer_kl"])], axis=0)
        if grid.ndim == 1:
            grid = grid[:, None]
        fig, ax = plt.subplots(figsize=(max(4.5, 0.45 * grid.shape[1] + 2.5), 5.5))
        floor = max(float(grid[grid > 0].min()), 1e-6) if (grid > 0).any() else 1e-6
        # Zero-loss cells sit at the floor (dark), not blank: blank would read as the brightest.
        im = ax.imshow(np.maximum(grid, floor), aspect="auto", cmap="magma", origin="lower",
                       norm=LogNorm(vmin=floor, vmax=max(float(grid.max()), floor * 10)))
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("query head" if per_head else "(per-layer only: this detail file has no head_kl)")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, label="mean offline KL")
        policy, _, params = label.partition(":")
        short = short_label(policy, params)
        ax.set_title(f"{short} @ {budget:g}: offline loss per layer × head", fontsize=9)
        fig.tight_layout()
        mode = str(detail["mode"].iloc[0]) if "mode" in detail.columns else detail.attrs.get("mode", "")
        figs.append(Figure(f"heatmap_{policy}_{budget:g}", f"Loss per layer and head: {short} @ {budget:g}"
                           + (f" ({mode})" if mode else ""),
                           f"Mean offline KL of {label} at {budget:g} of the bytes, over {rows['request'].nunique()} "
                           f"request(s) of {detail.attrs['path']}: bright cells are where this config loses the most.", fig))
    return figs
