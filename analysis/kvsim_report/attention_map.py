"""One request's attention map from a trace, with each policy's kept tokens marked and the prompt's
segments shaded: the picture that shows why a policy fails."""
import os

import h5py
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.patches import Patch

from .plots import SEGMENT_COLOURS, SEGMENTS, Figure, short_label
from .readers import InputError


MAX_ROWS = 1024  # query rows drawn (a figure holds no more pixels than this anyway)


def _attention(f, request, layer, head):
    """Softmax attention of each recorded query of `request` (rows) over the tokens, causal."""
    g = f["requests"][request]
    model = f["model"].attrs
    hq, hkv, d = int(model["n_q_heads"]), int(model["n_kv_heads"]), int(model["head_dim"])
    if not 0 <= head < hq:
        raise InputError(f"{f.filename}: --head {head}; expected a query head in [0, {hq})")
    qi = g["q_index"][()]
    rows = np.arange(len(qi))
    if len(rows) > MAX_ROWS:  # a long trace with every query recorded: an even sample of the rows
        rows = np.unique(np.linspace(0, len(qi) - 1, MAX_ROWS).astype(int))
    q = g["q"][layer, :, head, :][rows].astype(np.float32)           # [rows, d]
    k = g["k"][layer, :, head // (hq // hkv), :].astype(np.float32)  # [T, d]
    qi = qi[rows]
    logits = q @ k.T / np.sqrt(d)
    logits[np.arange(k.shape[0])[None, :] > qi[:, None]] = -np.inf
    logits -= logits.max(axis=1, keepdims=True)
    a = np.exp(logits)
    return a / a.sum(axis=1, keepdims=True), qi, g


def _kept_rows(keep, layer, head, hq, hkv, tokens):
    """[configs, T] masks of the tokens each config keeps for this head (its KV head's entry, or the
    query head's for per-query-head plans), and their labels."""
    rows, labels = [], []
    for c in keep["configs"]:
        kept = c["kept"]
        per_layer = kept[0] if keep.get("layer", -1) >= 0 else kept[layer]
        if not per_layer:
            continue
        entry = head if len(per_layer) == hq else head // (hq // hkv)
        m = np.zeros(tokens, dtype=bool)
        m[np.asarray(per_layer[entry], dtype=int)] = True
        rows.append(m)
        labels.append(f"{short_label(c['policy'], c.get('params', ''))} @ {c['budget']:g}")
    return np.array(rows), labels


def attention_maps(inputs, layer=None, head=0):
    figs = []
    if not inputs.keep_sets or not inputs.traces:
        return figs
    for keep in inputs.keep_sets:
        # The trace the keep-sets were made from, by path or name, else any holding the request.
        same = [t for t in inputs.traces if os.path.basename(t) == os.path.basename(keep.get("trace", ""))]
        trace = next((t for t in same + inputs.traces if _has_request(t, keep["request"])), None)
        if trace is None:
            raise InputError(f"{keep['path']}: request '{keep['request']}' is in none of the traces given "
                             f"({', '.join(inputs.traces)})")
        with h5py.File(trace, "r") as f:
            model = f["model"].attrs
            hq, hkv, n_layers = int(model["n_q_heads"]), int(model["n_kv_heads"]), int(model["n_layers"])
            lay = keep["layer"] if keep.get("layer", -1) >= 0 else (n_layers // 2 if layer is None else layer)
            if not 0 <= lay < n_layers:
                raise InputError(f"{trace}: --layer {lay}; expected a layer in [0, {n_layers})")
            att, qi, g = _attention(f, keep["request"], lay, head)
            seg = g["segments"][()]
            needle = (int(g.attrs["needle_start"]), int(g.attrs["needle_end"]))
        masks, labels = _kept_rows(keep, lay, head, hq, hkv, att.shape[1])
        figs.append(_draw(att, qi, seg, needle, masks, labels, keep, lay, head))
    return figs


def _has_request(path, request):
    with h5py.File(path, "r") as f:
        return "requests" in f and request in f["requests"]


def _draw(att, qi, seg, needle, masks, labels, keep, layer, head):
    T = att.shape[1]
    n = max(1, len(labels))
    fig, (top, ax, bottom) = plt.subplots(3, 1, figsize=(11, 6 + 0.22 * n), sharex=True,
                                          gridspec_kw={"height_ratios": [0.35, 4, 0.3 * n]})
    for s, name in enumerate(SEGMENTS):  # the prompt's segments as a band
        idx = np.nonzero(seg == s)[0]
        if len(idx):
            top.axvspan(idx.min() - 0.5, idx.max() + 0.5, color=SEGMENT_COLOURS[name])
    if needle[0] >= 0:
        top.axvspan(needle[0] - 0.5, needle[1] - 0.5, color=SEGMENT_COLOURS["needle"])
    top.set_yticks([])
    top.legend(handles=[Patch(color=SEGMENT_COLOURS[k], label=k) for k in SEGMENTS + ["needle"]], ncol=5, fontsize=7,
               loc="lower right", bbox_to_anchor=(1, 1.05), frameon=False)
    floor = max(att[att > 0].min(), 1e-5)
    im = ax.imshow(np.maximum(att, floor), aspect="auto", cmap="viridis", norm=LogNorm(vmin=floor, vmax=1),
                   extent=(-0.5, T - 0.5, len(qi) - 0.5, -0.5), interpolation="nearest")
    ax.set_ylabel("recorded query (row)")
    cut = keep["compression_point"]
    ax.axvline(cut - 0.5, color="white", lw=0.8, ls="--")
    fig.colorbar(im, ax=[top, ax, bottom], label="attention weight", fraction=0.025, pad=0.01)
    if len(masks):
        bottom.imshow(masks, aspect="auto", cmap="Greys", interpolation="nearest", extent=(-0.5, T - 0.5, n - 0.5, -0.5))
        bottom.set_yticks(range(n))
        bottom.set_yticklabels(labels, fontsize=7)
    bottom.set_xlabel("token")
    fig.suptitle(f"request {keep['request']}, layer {layer}, head {head} ({keep['mode']})")
    return Figure(f"attention_{keep['request']}_l{layer}_h{head}", f"Attention map: request {keep['request']}",
                  f"Attention of each recorded query over the tokens (layer {layer}, query head {head}; the dashed line "
                  f"is the compression point); below, in black, the tokens each policy keeps. A policy fails where "
                  f"the question's attention lands on tokens it dropped, such as the red needle span.", fig)
