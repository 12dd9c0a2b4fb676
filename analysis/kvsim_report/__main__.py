"""python -m kvsim_report INPUTS... -o report.html  (what `kvsim report` runs)."""
import argparse
import os
import sys

from .page import build_report
from .readers import InputError


def main(argv=None):
    p = argparse.ArgumentParser(prog="kvsim report", description=(
        "One HTML page of plots (and a PNG per plot) from kvsim result files: sweep CSV (+ --detail JSONL), verify "
        "CSV (+ agreement CSV), serve CSV/JSON, a trace (.h5) with `kvsim trace keep-sets` JSON, learned-model files."))
    p.add_argument("inputs", nargs="+", help="result files, any order; their kind is read from their content")
    p.add_argument("-o", "--out", required=True, help="the HTML file to write (PNGs go to OUT_figures/)")
    p.add_argument("--config", help="heatmap config as LABEL@BUDGET (default: the offline-best at the smallest budget)")
    p.add_argument("--layer", type=int, help="attention map layer when the keep-sets hold every layer (default: middle; "
                   "keep-sets made with -l use their own layer)")
    p.add_argument("--head", type=int, default=0, help="attention map query head (default 0)")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines or notes (results still print)")
    a = p.parse_args(argv)
    if os.path.exists(a.out) and not a.force:
        print(f"kvsim report: error: {a.out}: file exists; refusing to overwrite it (pass --force to replace)",
              file=sys.stderr)
        return 1
    try:
        pngs = build_report(a.inputs, a.out, {"config": a.config, "layer": a.layer, "head": a.head})
    except InputError as e:
        print(f"kvsim report: error: {e}", file=sys.stderr)
        return 1
    print(f"{a.out}: {len(pngs)} figure(s); PNGs beside it in {os.path.splitext(a.out)[0]}_figures/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
