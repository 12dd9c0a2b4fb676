"""Offline against live: per config, the sweep's offline metric beside verify's live KL, with the
rank agreement (Spearman) per budget."""
import matplotlib.pyplot as plt
import pandas as pd

from .plots import Figure, family, FAMILY_COLOURS
from .readers import config_means


def spearman(x, y):
    """Spearman's rho: the Pearson correlation of the average ranks (no scipy needed)."""
    if len(x) < 3:
        return float("nan")
    return float(pd.Series(list(x)).rank().corr(pd.Series(list(y)).rank()))


def offline_vs_live(inputs):
    figs = []
    if not inputs.sweep or not inputs.verify:
        return figs
    sweep, live = pd.concat(inputs.sweep), pd.concat(inputs.verify)
    for mode in sorted(set(live["mode"]) & set(sweep["mode"])):
        s, v = sweep[sweep["mode"] == mode], live[live["mode"] == mode]
        v = v[v["request"].isin(set(s["request"]))]
        metric = "est_kl" if "est_kl" in s and s["est_kl"].notna().any() else "mean_kl"
        keys = ["mode", "policy", "params", "budget"]
        joined = config_means(s[s["request"].isin(set(v["request"]))], [metric]).merge(
            config_means(v, ["live_kl"])[keys + ["live_kl"]], on=keys)
        joined = joined[joined["policy"] != "full"]
        if len(joined) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 5))
        lines = []
        for i, (budget, sub) in enumerate(sorted(joined.groupby("budget"), key=lambda t: t[0])):
            marker = "osD^v<>"[i % 7]
            for fam, colour in FAMILY_COLOURS.items():
                part = sub[sub["policy"].map(family) == fam]
                if len(part):
                    ax.scatter(part[metric], part["live_kl"], c=colour, marker=marker, s=30, alpha=0.85)
            rho_b = spearman(sub[metric], sub["live_kl"])
            lines.append(f"budget {budget:g}: " + (f"Spearman {rho_b:.2f}" if rho_b == rho_b else "n/a")
                         + f" ({len(sub)} config{'s' if len(sub) != 1 else ''})")
        rho = spearman(joined[metric], joined["live_kl"])
        ax.set_xscale("symlog", linthresh=max(1e-4, float(joined.loc[joined[metric] > 0, metric].min())))
        ax.set_yscale("symlog", linthresh=max(1e-4, float(joined.loc[joined["live_kl"] > 0, "live_kl"].min())))
        ax.set_xlabel("offline " + ("estimate of live KL (est_kl)" if metric == "est_kl" else "KL (mean_kl)"))
        ax.set_ylabel("live KL")
        ax.grid(alpha=0.3)
        ax.set_title(f"Offline vs live, {mode}: Spearman {rho:.2f}")
        ax.text(0.02, 0.98, "\n".join(lines), transform=ax.transAxes, va="top", fontsize=7,
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
        for fam, colour in FAMILY_COLOURS.items():
            if (joined["policy"].map(family) == fam).any():
                ax.scatter([], [], c=colour, label=fam)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        figs.append(Figure(f"offline_vs_live_{mode}", f"Offline vs live ({mode})",
                           f"Each point is a config's mean over {joined.shape[0] and v['request'].nunique()} request(s), "
                           f"marker by budget: points on a rising line mean the offline sweep ranks configs as the live "
                           f"model does (Spearman {rho:.2f} overall, per budget in the box).", fig))
    return figs
