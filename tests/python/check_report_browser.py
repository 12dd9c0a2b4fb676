#!/usr/bin/env python3
"""kvsim report end to end, looked at in a real headless browser: every plot the inputs call for is
in the page, each loads (non-zero size) and is not blank (its pixels vary), in Chromium and in the
PNGs beside the page. Exits 77 (skipped) only where no browser is installed.

Usage: check_report_browser.py KVSIM OUTDIR FIXTURE_DIR
"""
import html
import os
import re
import shutil
import subprocess
import sys

import matplotlib.image as mpimg
import numpy as np

from branching_trace import write_branching_trace

CHECK_SCRIPT = """<script>
window.addEventListener('load', () => {
  const out = [];
  for (const img of document.querySelectorAll('img.plot')) {
    let varied = false;
    if (img.complete && img.naturalWidth > 0) {
      const c = document.createElement('canvas');
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      const g = c.getContext('2d'); g.drawImage(img, 0, 0);
      const d = g.getImageData(0, 0, c.width, c.height).data;
      for (let i = 4; i < d.length; i += 4 * 31)
        if (d[i] !== d[0] || d[i + 1] !== d[1] || d[i + 2] !== d[2]) { varied = true; break; }
    }
    out.push(img.alt + '|' + img.naturalWidth + '|' + varied);
  }
  const pre = document.createElement('pre'); pre.id = 'image-check'; pre.textContent = out.join('\\n');
  document.body.appendChild(pre);
});
</script>"""


def browser():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def run(*args):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"{' '.join(args[:3])} ... failed with {p.returncode}")
    return p.stdout


def mooncake(path):
    write_branching_trace(path, seed=2, n=120, max_new_blocks=4, ts_step=200, output=(1, 40))


def main():
    kvsim, out, fix = sys.argv[1:4]
    chrome = browser()
    if chrome is None:
        print("report browser: skipped (no headless browser installed; scripts/setup.sh installs chromium)")
        return 77
    os.makedirs(out, exist_ok=True)
    trace, keep, req = f"{out}/synth.h5", f"{out}/keep.json", f"{out}/requests.jsonl"
    run(kvsim, "trace", "synth", "-o", trace, "--force", "--requests", "1", "--context", "384")
    run(kvsim, "trace", "keep-sets", trace, "-p", "snapkv;h2o;streamingllm", "-b", "0.25", "-l", "1", "-o", keep, "--force")
    mooncake(req)
    run(kvsim, "serve", "hit-rate", req, "-c", "20,50,200", "-e", "lru,rppc", "-o", f"{out}/hits.csv", "--force")
    run(kvsim, "serve", "simulate", req, "--hbm-gb", "2,4", "--dram-gb", "8", "-e", "lru,rppc", "--quiet",
        "--json", f"{out}/sim.json", "--force")
    inputs = [f"{fix}/sweep.csv", f"{fix}/sweep.jsonl", f"{fix}/verify.csv", f"{fix}/agreement.csv", trace, keep,
              f"{out}/hits.csv", f"{out}/sim.json"]
    report = f"{out}/report.html"
    print(run(kvsim, "report", *inputs, "-o", report, "--force").strip())
    # Expected: frontier x 2 modes, 1 heatmap, 1 attention map, offline vs live (query-aware), serve
    # hit rate (hit-rate mode), serve hit rate and TTFT CDF (simulation).
    expected = 8
    failures = 0
    pngs = sorted(os.listdir(f"{out}/report_figures"))
    if len(pngs) != expected:
        print(f"FAIL: {len(pngs)} PNGs, expected {expected}: {pngs}")
        failures += 1
    for p in pngs:
        px = mpimg.imread(f"{out}/report_figures/{p}")
        if px.size == 0 or float(np.std(px)) < 0.01:
            print(f"FAIL: {p} is blank")
            failures += 1
    page = open(report).read()
    checked = f"{out}/report_checked.html"
    with open(checked, "w") as f:
        f.write(page.replace("</body>", CHECK_SCRIPT + "</body>"))
    dom = subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=15000", "--dump-dom", "file://" + os.path.abspath(checked)],
                         capture_output=True, text=True, timeout=180).stdout
    m = re.search(r'<pre id="image-check">(.*?)</pre>', dom, re.S)
    if not m:
        print("FAIL: the browser did not run the page's check (no image-check element in the DOM)")
        return 1
    rows = [line.split("|") for line in html.unescape(m.group(1)).splitlines() if line]
    if len(rows) != expected:
        print(f"FAIL: the browser shows {len(rows)} plots, expected {expected}")
        failures += 1
    for alt, width, varied in rows:
        if int(width) == 0 or varied != "true":
            print(f"FAIL: plot '{alt}' in the browser: width {width}, pixels vary: {varied}")
            failures += 1
    for title in ("Pareto frontier (query-aware)", "Attention map", "Offline vs live (query-aware)", "TTFT distribution"):
        if title not in page:
            print(f"FAIL: no '{title}' figure")
            failures += 1
    print(f"browser: {os.path.basename(chrome)}, {len(rows)} plots loaded")
    print("report browser:", "passed" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
