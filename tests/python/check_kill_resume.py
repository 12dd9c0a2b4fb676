#!/usr/bin/env python3
"""kill -9 at random points: `kvsim capture`, `kvsim sweep` and `kvsim serve simulate` are killed
several times and resumed each time. Every result committed before a kill survives it, and the
resumed output equals an uninterrupted run's: the same trace data request by request (capture), the
same files byte for byte (sweep), the same rows but for their wall-clock `seconds` (serve)."""
import os
import random
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def killed_runs(first, again, rng, kills, low, high, progress):
    """Runs `first`, then `again` (the resume) until one finishes. Each run is killed (SIGKILL),
    `kills` times in all, at a random moment in [low, high) seconds after `progress()` (work on
    disk) first grows in that run, so every kill lands after some work and at a random point of
    the next piece, whatever the machine's load. Yields the kill count after each kill."""
    cmd, n = first, 0
    killed_runs.kills = 0
    while True:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if n < kills:
            start, deadline = progress(), None
            while p.poll() is None:
                if deadline is None and progress() > start:
                    deadline = time.monotonic() + rng.uniform(low, high)
                if deadline is not None and time.monotonic() >= deadline:
                    p.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.02)
            if p.wait() == -signal.SIGKILL:
                n += 1
                killed_runs.kills = n
                yield n
                cmd = again
                continue
        err = p.communicate()[1].decode()
        expect(p.returncode == 0, f"{' '.join(cmd[:2])} finished with {p.returncode}: {err.strip()}")
        return


def committed(path):
    if not os.path.exists(path):
        return set()
    with h5py.File(path, "r") as f:
        return {rid for rid, g in f["requests"].items() if g.attrs["status"].decode() == "complete"}


def trace_data(path):
    out = {}
    with h5py.File(path, "r") as f:
        reqs = sorted(f["requests"].items(), key=lambda kv: int(kv[1].attrs["index"]))
        out["order"] = [rid for rid, _ in reqs]
        for rid, g in reqs:
            for name in ("tokens", "positions", "segments", "q_index", "k", "v", "q", "ref/index", "ref/topk_ids",
                         "ref/topk_logp", "ref/lse"):
                out[f"{rid}/{name}"] = g[name][()]
    return out


def a_order(path):
    return trace_data(path)["order"]


def check_capture(kvsim, model, workdir, rng):
    tasks = os.path.join(workdir, "kill_tasks.jsonl")
    run([kvsim, "tasks", "needle", "--count", "6", "--tokens", "240", "--seed", "3", "-o", tasks, "--force"])
    full, resumed = os.path.join(workdir, "kill_full.h5"), os.path.join(workdir, "kill_resumed.h5")
    base = [kvsim, "capture", "-m", model, "-r", tasks, "--max-new", "8", "--queries", "all"]
    run(base + ["-o", full, "--force"])
    for p in (resumed, resumed + ".partial"):
        if os.path.exists(p):
            os.remove(p)
    seen = set()
    partial = resumed + ".partial"
    # Progress: the partial file grows when a request ends (its K/V are written then), and HDF5's
    # lock keeps other readers out of a file being written, so its size is what is watched.
    for n in killed_runs(base + ["-o", resumed], base + ["-o", resumed, "--resume"], rng, 3, 0.0, 0.8,
                         lambda: os.path.getsize(partial) // 1_000_000 if os.path.exists(partial) else 0):
        now = committed(resumed + ".partial")
        expect(seen <= now, f"capture kill {n}: committed requests lost: {sorted(seen - now)}")
        seen = now
        print(f"capture: kill {n}, {len(now)} requests committed", flush=True)
    expect(killed_runs.kills >= 2 and 0 < len(seen), f"capture: {killed_runs.kills} kills, {len(seen)} requests "
           "committed before the last: the test must kill mid-capture and resume with requests kept")
    expect(not os.path.exists(resumed + ".partial"), "capture: the partial file was renamed at the end")
    # Resuming a capture that finished is a no-op (the kill may land after the rename).
    run(base + ["-o", resumed, "--resume"])
    expect(trace_data(resumed)["order"] == a_order(full), "capture: a no-op resume changed the trace")
    a, b = trace_data(full), trace_data(resumed)
    expect(a["order"] == b["order"], f"capture: request order {b['order']} != {a['order']}")
    for key in a:
        if key != "order":
            expect(key in b and np.array_equal(a[key], b[key]), f"capture: {key} differs from the uninterrupted run")


def check_sweep(kvsim, workdir, rng):
    trace = os.path.join(workdir, "kill_sweep.h5")
    run([kvsim, "trace", "synth", "-o", trace, "--force", "--requests", "8", "--context", "1536", "--layers", "6"])
    out = {k: os.path.join(workdir, f"kill_{k}") for k in ("full.csv", "full.jsonl", "res.csv", "res.jsonl")}
    base = [kvsim, "sweep", trace, "-p", "snapkv;h2o;tova;streamingllm;kivi", "-b", "0.2,0.5", "-q"]
    run(base + ["-o", out["full.csv"], "--detail", out["full.jsonl"], "--force"])
    for key in ("res.csv", "res.jsonl"):
        if os.path.exists(out[key]):
            os.remove(out[key])
    first = base + ["-o", out["res.csv"], "--detail", out["res.jsonl"], "--force"]
    again = base + ["-o", out["res.csv"], "--detail", out["res.jsonl"], "--resume"]

    def finished_rows(path):
        if not os.path.exists(path):
            return []
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")[:-1]  # the last, unterminated line may be torn
        return [l for l in lines if l and not l.startswith(b"#") and not l.startswith(b"trace,")]

    seen = []
    for n in killed_runs(first, again, rng, 4, 0.0, 0.6, lambda: len(finished_rows(out["res.csv"]))):
        rows = finished_rows(out["res.csv"])
        expect(rows[:len(seen)] == seen, f"sweep kill {n}: rows written before are gone")
        seen = rows
        print(f"sweep: kill {n}, {len(rows)} rows on disk", flush=True)
    expect(killed_runs.kills >= 2 and len(seen) > 0, f"sweep: {killed_runs.kills} kills, {len(seen)} rows kept "
           "before the last: the test must kill mid-sweep and resume with rows kept")
    for a, b in (("full.csv", "res.csv"), ("full.jsonl", "res.jsonl")):
        with open(out[a], "rb") as fa, open(out[b], "rb") as fb:
            expect(fa.read() == fb.read(), f"sweep: {b} differs from the uninterrupted {a}")


def check_serve(kvsim, workdir, rng):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from branching_trace import write_branching_trace
    from serve_results import serve_rows
    trace = os.path.join(workdir, "kill_serve.jsonl")
    write_branching_trace(trace, 5, 12000, 4, 5, (1, 256))
    full, res = os.path.join(workdir, "kill_serve_full.csv"), os.path.join(workdir, "kill_serve_res.csv")
    base = [kvsim, "serve", "simulate", trace, "-e", "lru,slru,rppc", "--hbm-gb", "0.5,1,2,4", "-q"]
    run(base + ["-o", full, "--json", full[:-4] + ".json", "--force"])
    for p in (res, res[:-4] + ".json", res + ".progress"):
        if os.path.exists(p):
            os.remove(p)
    progress = res + ".progress"

    def finished_points():
        if not os.path.exists(progress):
            return []
        with open(progress, "rb") as f:
            return f.read().split(b"\n")[1:-1]  # the header, then whole lines only

    outputs = ["-o", res, "--json", res[:-4] + ".json"]
    seen = []
    for n in killed_runs(base + outputs, base + outputs + ["--resume"], rng, 3, 0.0, 0.4, lambda: len(finished_points())):
        points = finished_points()
        expect(points[:len(seen)] == seen, f"serve kill {n}: points finished before are gone")
        seen = points
        print(f"serve: kill {n}, {len(points)} grid points on disk", flush=True)
    expect(killed_runs.kills >= 2 and len(seen) > 0, f"serve: {killed_runs.kills} kills, {len(seen)} points kept "
           "before the last: the test must kill mid-grid and resume with points kept")
    expect(not os.path.exists(progress), "serve: the progress file was removed at the end")
    expect(serve_rows(full) == serve_rows(res), "serve: the resumed rows differ from the uninterrupted run's")
    # Resuming a grid that finished says so and changes nothing.
    before = open(res, "rb").read()
    out = subprocess.run(base + outputs + ["--resume"], check=True, capture_output=True, text=True).stdout
    expect("nothing to resume" in out and open(res, "rb").read() == before, "serve: a resume after the end is a no-op")


def main() -> int:
    kvsim, model, workdir = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = random.Random(int(os.environ.get("KVSIM_KILL_SEED", "7")))
    check_capture(kvsim, model, workdir, rng)
    check_sweep(kvsim, workdir, rng)
    check_serve(kvsim, workdir, rng)
    print(f"kill -9 check: {'failed' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
