#!/usr/bin/env python3
"""kvsim calibrate / agreement / sweep --estimator end to end on a synthetic trace. The "live" KL
is planted: a fixed non-negative weighting of each row's per-layer squared output error (from
the sweep's detail file), plus a small per-request factor. Calibrated on the first requests, the
estimate must rank the held-out request's configs as the planted KL does, the agreement report
must leave the calibration requests out, and sweep --estimator must write the same estimate."""
import csv
import json
import os
import subprocess
import sys


def run(cmd, expect_fail=False):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if (p.returncode != 0) != expect_fail:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def main() -> int:
    kvsim, work = sys.argv[1], sys.argv[2]
    trace, sweep, detail = (os.path.join(work, n) for n in ("est.h5", "est_sweep.csv", "est_sweep.jsonl"))
    run([kvsim, "trace", "synth", "-o", trace, "--force", "--layers", "4", "--q-heads", "4", "--kv-heads", "2",
         "--head-dim", "16", "--context", "96", "--needle", "6", "--requests", "3", "--seed", "9"])
    policies = "streamingllm;snapkv;h2o;tova;keydiff;intn:bits=4;intn:bits=2"
    run([kvsim, "sweep", trace, "-p", policies, "-b", "0.2,0.4,0.6", "-o", sweep, "--detail", detail, "--force", "-q"])
    weights = [0.5, 0.0, 2.0, 1.0]
    layers = {}
    with open(detail) as f:
        for line in f:
            j = json.loads(line)
            if "request" in j:
                layers[(j["request"], j["policy"], j["budget"])] = j["layer_out_sq"]
    planted = {k: sum(w * x for w, x in zip(weights, v)) for k, v in layers.items()}
    requests = sorted({k[0] for k in planted})
    cal_csv, held_csv = os.path.join(work, "est_live_cal.csv"), os.path.join(work, "est_live_held.csv")
    header = ["request", "task", "mode", "policy", "params", "budget", "live_kl", "top1", "task_score", "generated"]
    for path, keep in ((cal_csv, requests[:2]), (held_csv, requests[2:])):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            f.write("# kvsim verify results (planted for the test)\n")
            w.writerow(header)
            for r in rows(sweep):
                if r["request"] not in keep or float(r["budget"]) >= 1:
                    continue
                label = r["policy"] + (":" + r["params"] if r["params"] else "")
                kl = planted[(r["request"], label, float(r["budget"]))] * (1.0 + 0.01 * requests.index(r["request"]))
                w.writerow([r["request"], "t", r["mode"], r["policy"], r["params"], r["budget"], kl, 0.5, "nan",
                            "two\nlines"])
    est = os.path.join(work, "est.json")
    out = run([kvsim, "calibrate", "--offline", sweep, "--detail", detail, "--live", cal_csv, "-o", est, "--force",
               "--smoothness", "0"])
    failures = []
    if "fitted on" not in out:
        failures.append("calibrate: no summary line")
    fitted = json.load(open(est))
    if fitted["calibration"]["requests"] != requests[:2]:
        failures.append(f"calibration requests {fitted['calibration']['requests']}")
    if len(fitted["weights"]) != len(weights):
        failures.append(f"{len(fitted['weights'])} weights for {len(weights)} layers")
    for got, want in zip(fitted["weights"], weights):
        if abs(got - want * 1.005) > 0.05 * max(want, 0.1):
            failures.append(f"weights {fitted['weights']} vs planted {weights}")
            break
    # Held out: the estimate ranks configs as the planted KL does.
    agree = os.path.join(work, "est_agreement.csv")
    run([kvsim, "agreement", "--offline", sweep, "--detail", detail, "--live", cal_csv, held_csv, "--estimator", est,
         "-o", agree, "--force"])
    table = {r["offline_metric"]: r for r in rows(agree)}
    if "est_kl" not in table or float(table["est_kl"]["spearman_live_kl"]) < 0.99:
        failures.append(f"est_kl agreement {table.get('est_kl')}")
    if "2 calibration requests left out" not in open(agree).read():
        failures.append("agreement: calibration requests not reported as left out")
    # Only calibration requests: refused, naming why.
    out = run([kvsim, "agreement", "--offline", sweep, "--detail", detail, "--live", cal_csv, "--estimator", est],
              expect_fail=True)
    if "left out" not in out:
        failures.append(f"agreement over calibration requests only: {out}")
    # sweep --estimator writes the same estimate per row.
    swept = os.path.join(work, "est_sweep2.csv")
    run([kvsim, "sweep", trace, "-p", policies, "-b", "0.2,0.4,0.6", "-o", swept, "--estimator", est, "--force", "-q"])
    compared = 0
    for r in rows(swept):
        label = r["policy"] + (":" + r["params"] if r["params"] else "")
        key = (r["request"], label, float(r["budget"]))
        if key in layers:
            want = sum(w * x for w, x in zip(fitted["weights"], layers[key]))
            compared += 1
            if abs(float(r["est_kl"]) - want) > 1e-6 * max(1.0, want):
                failures.append(f"sweep est_kl {r['est_kl']} vs {want} for {key}")
                break
    if compared == 0:
        failures.append("sweep --estimator: no row compared")
    # A bad estimator file names itself and the field.
    bad = os.path.join(work, "est_bad.json")
    with open(bad, "w") as f:
        f.write('{"kvsim_estimator": 1}')
    out = run([kvsim, "sweep", trace, "-p", "snapkv", "-o", swept, "--estimator", bad, "--force", "-q"], expect_fail=True)
    if "est_bad.json" not in out or "'feature'" not in out:
        failures.append(f"bad estimator file: {out}")
    for f in failures:
        print("FAIL:", f)
    print(f"estimator cli: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
