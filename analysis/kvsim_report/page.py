"""The report page: every figure the inputs allow, as one self-contained HTML file (PNGs embedded
as data URIs, readable offline) plus one PNG per figure beside it."""
import base64
import datetime
import html
import io
import os

import matplotlib.pyplot as plt

from .agreement_plot import offline_vs_live
from .attention_map import attention_maps
from .plots import head_heatmaps, pareto_frontiers
from .readers import read_inputs
from .serve_plots import hit_rate_curves, training_curves

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
figure{margin:2em 0;border-top:1px solid #ddd;padding-top:1em}img{max-width:100%}
figcaption{font-size:.95em;color:#444;margin-top:.4em}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ccc;padding:2px 6px}code{background:#f4f4f4}h2,figcaption{overflow-wrap:anywhere}"""


def figures(inputs, options):
    out = []
    out += pareto_frontiers(inputs)
    out += head_heatmaps(inputs, options.get("config"))
    out += attention_maps(inputs, options.get("layer"), options.get("head", 0))
    out += offline_vs_live(inputs)
    out += hit_rate_curves(inputs)
    out += training_curves(inputs)
    return out


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _agreement_tables(inputs):
    parts = []
    for path, df in inputs.agreement:
        parts.append(f"<h3>Agreement report: <code>{html.escape(path)}</code></h3>")
        parts.append(df.to_html(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-", border=0))
    return "\n".join(parts)


def build_report(paths, out, options=None):
    """Writes `out` (HTML) and OUT_figures/NN_stem.png; returns the PNG paths."""
    options = options or {}
    inputs = read_inputs(paths)
    figs = figures(inputs, options)
    png_dir = os.path.splitext(out)[0] + "_figures"
    os.makedirs(png_dir, exist_ok=True)
    for old in os.listdir(png_dir):  # an earlier report's figures would mix with these
        if old.endswith(".png") and old[:2].isdigit():
            os.remove(os.path.join(png_dir, old))
    body, pngs = [], []
    for i, f in enumerate(figs, 1):
        data = _png(f.fig)
        png = os.path.join(png_dir, f"{i:02d}_{f.stem.replace('/', '_')}.png")
        with open(png, "wb") as fh:
            fh.write(data)
        pngs.append(png)
        body.append(f'<figure id="{html.escape(f.stem)}"><h2>{html.escape(f.title)}</h2>'
                    f'<img class="plot" alt="{html.escape(f.title)}" src="data:image/png;base64,'
                    f'{base64.b64encode(data).decode()}"><figcaption>{html.escape(f.caption)}</figcaption></figure>')
    listing = "".join(f"<li><code>{html.escape(p)}</code></li>" for p in paths)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvsim report</title><style>{STYLE}</style>"
            f"</head><body><h1>kvsim report</h1><p>{len(figs)} figure(s) from {len(paths)} input(s), written {when}:</p>"
            f"<ul>{listing}</ul>{''.join(body)}{_agreement_tables(inputs)}</body></html>\n")
    tmp = out + ".partial"
    with open(tmp, "w") as fh:
        fh.write(page)
    os.replace(tmp, out)
    return pngs
