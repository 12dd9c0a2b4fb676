#!/usr/bin/env python3
"""`kvsim train` as a user runs it: train foresight on one synthetic trace, sweep it on another,
and the refusals (its own training prompts, an unknown method, an existing output file).
Usage: check_train_cli.py KVSIM WORKDIR. Prints "train cli: passed"."""
import os
import subprocess
import sys


def run(*args, ok=True):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"train cli: {' '.join(args)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    if not ok and p.returncode == 0:
        sys.exit(f"train cli: {' '.join(args)} succeeded; expected a refusal")
    return p


def main():
    kvsim, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    small = ["--layers", "3", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--vocab", "500",
             "--context", "48", "--needle", "4", "--requests", "5"]
    a, b = os.path.join(work, "train_a.h5"), os.path.join(work, "train_b.h5")
    model = os.path.join(work, "foresight.h5")
    run(kvsim, "trace", "synth", "-o", a, "--force", "--seed", "1", *small)
    run(kvsim, "trace", "synth", "-o", b, "--force", "--seed", "2", *small)
    p = run(kvsim, "train", "foresight", a, "-o", model, "--force", "--steps", "40", "--hidden", "8")
    if "step 40/40" not in p.stderr or "foresight model" not in p.stdout:
        sys.exit(f"train cli: no progress line or summary:\n{p.stdout}{p.stderr}")
    csv = os.path.join(work, "foresight.csv")
    run(kvsim, "sweep", b, "--policies", f"foresight:model={model},snapkv", "--budgets", "0.25", "-o", csv, "--force", "-q")
    rows = [l for l in open(csv) if l.startswith(b)]
    if len([l for l in rows if ",foresight," in l]) != 5:
        sys.exit(f"train cli: expected 5 foresight rows in {csv}, got:\n{''.join(rows)}")
    p = run(kvsim, "sweep", a, "--policies", f"foresight:model={model}", "--budgets", "0.25", "-o", csv, "--force", ok=False)
    if "was trained on this request's prompt" not in p.stderr:
        sys.exit(f"train cli: evaluating on training prompts was not refused clearly:\n{p.stderr}")
    run(kvsim, "sweep", a, "--policies", f"foresight:model={model}", "--budgets", "0.25", "-o", csv, "--force", "-q",
        "--allow-training-requests")
    gate = os.path.join(work, "sigmoid_gate.h5")
    p = run(kvsim, "train", "sigmoid_gate", a, "-o", gate, "--force", "--steps", "30", "--hidden", "8", "--rows", "4")
    if "soft-to-hard gap" not in p.stderr:
        sys.exit(f"train cli: sigmoid_gate printed no soft-to-hard gap:\n{p.stderr}")
    run(kvsim, "sweep", b, "--policies", f"sigmoid_gate:model={gate}", "--budgets", "0.25", "-o", csv, "--force", "-q")
    rl = os.path.join(work, "distillcache.h5")
    p = run(kvsim, "train", "distillcache", a, "-o", rl, "--force", "--episodes", "6", "--samples", "2", "--hidden", "8",
            "--budgets", "0.25", "--init", model)
    if "episode" not in p.stderr and "step 6/6" not in p.stderr:
        sys.exit(f"train cli: distillcache printed no progress:\n{p.stderr}")
    if "offline estimate" not in p.stderr:
        sys.exit(f"train cli: distillcache printed no held-out estimate:\n{p.stderr}")
    run(kvsim, "sweep", b, "--policies", f"distillcache:model={rl}", "--budgets", "0.25", "-o", csv, "--force", "-q")
    # rlkv: trained on the per-head proxy (a window that leaves tokens out of these short prompts),
    # and imported from RLKV's gate file layout.
    gates = os.path.join(work, "rlkv.h5")
    p = run(kvsim, "train", "rlkv", a, "-o", gates, "--force", "--steps", "50", "--sinks", "2", "--recent", "8")
    if "heads gated to the whole cache" not in p.stderr or "head gates" not in p.stdout:
        sys.exit(f"train cli: rlkv printed no gate summary:\n{p.stdout}{p.stderr}")
    tsv = os.path.join(work, "adapter_weights.tsv")
    with open(tsv, "w") as f:
        f.write("0.9\t0.1\n0.2\t0.8\n0.5\t0.4\n")
    imported = os.path.join(work, "rlkv_imported.h5")
    run(kvsim, "train", "rlkv", "--import", tsv, a, "-o", imported, "--force")
    run(kvsim, "sweep", b, "--policies", f"rlkv:model={gates};rlkv:model={imported}", "--budgets", "0.5", "-o", csv,
        "--force", "-q")
    with open(tsv, "a") as f:
        f.write("0.3\n")
    p = run(kvsim, "train", "rlkv", "--import", tsv, a, "-o", imported, "--force", ok=False)
    if "line 4 has 1 gates; expected 2" not in p.stderr:
        sys.exit(f"train cli: a malformed gate file was not named:\n{p.stderr}")
    p = run(kvsim, "train", "bogus", a, "-o", model, ok=False)
    if "unknown training method 'bogus'" not in p.stderr:
        sys.exit(f"train cli: an unknown method was not named:\n{p.stderr}")
    p = run(kvsim, "train", "foresight", a, "-o", model, ok=False)
    if "refusing to overwrite" not in p.stderr:
        sys.exit(f"train cli: an existing model file was not protected:\n{p.stderr}")
    print("train cli: passed")


if __name__ == "__main__":
    main()
