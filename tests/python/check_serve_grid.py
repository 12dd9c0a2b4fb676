#!/usr/bin/env python3
"""`kvsim serve` parameter grids: the progress file's refusals, a torn line, and (given mpirun) the
grid over 2 and 3 MPI ranks and a resume under MPI from a serial run's progress file, each equal to
the serial run but for the wall-clock `seconds`.

usage: check_serve_grid.py KVSIM WORKDIR [MPIRUN]"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from branching_trace import write_branching_trace  # noqa: E402
from serve_results import serve_rows as rows  # noqa: E402

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def kvsim_run(cmd, ok=True, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    expect((p.returncode == 0) == ok, f"{' '.join(cmd[1:4])}: exit {p.returncode}, expected {'0' if ok else 'an error'}: "
           f"{p.stderr.strip()}")
    return p.stdout + p.stderr


def main() -> int:
    kvsim, workdir = sys.argv[1], sys.argv[2]
    mpirun = sys.argv[3] if len(sys.argv) > 3 else None
    trace = os.path.join(workdir, "grid.jsonl")
    write_branching_trace(trace, 9, 3000, 4, 5, (1, 128))
    grids = {
        "simulate": [kvsim, "serve", "simulate", trace, "-e", "lru,rppc", "--hbm-gb", "0.25,0.5,1", "-q"],
        "hit-rate": [kvsim, "serve", "hit-rate", trace, "-e", "lru,lfu,slru", "-c", "50,200,800"],
    }
    for name, base in grids.items():
        serial = os.path.join(workdir, f"grid_{name}_serial.csv")
        outs = lambda p: ["-o", p, "--json", p[:-4] + ".json"]  # noqa: E731
        kvsim_run(base + outs(serial) + ["--force"])
        want = rows(serial)

        # A progress file left by a stopped run: refused without --resume, and under another configuration.
        res = os.path.join(workdir, f"grid_{name}_res.csv")
        for p in (res, res[:-4] + ".json"):
            if os.path.exists(p):
                os.remove(p)
        with open(res + ".progress", "w") as f:
            f.write(json.dumps({"config": {"command": "another"}}) + "\n")
        err = kvsim_run(base + outs(res), ok=False)
        expect("pass --resume" in err, f"{name}: a progress file without --resume: {err.strip()}")
        err = kvsim_run(base + outs(res) + ["--resume"], ok=False)
        expect("different configuration" in err, f"{name}: another configuration's progress file: {err.strip()}")

        # What a run killed mid-write leaves (two whole points, a torn third), resumed and stopped the
        # same way again, then resumed to the end: the serial rows.
        stopped = kvsim_run(base + outs(res) + ["--force"], ok=False, env={"KVSIM_GRID_STOP_AFTER": "2"})
        expect("stopped after 2 points" in stopped, f"{name}: the stop hook: {stopped.strip()}")
        # A row that is not this grid's is refused by file and line, not printed or written.
        with open(res + ".progress") as f:
            kept = f.read()
        with open(res + ".progress", "a") as f:
            f.write(json.dumps({"point": 2, "row": {"eviction": "lru"}}) + "\n")
        err = kvsim_run(base + outs(res) + ["--resume"], ok=False)
        expect(".progress: line 4: the row has no" in err, f"{name}: a foreign row: {err.strip()}")
        with open(res + ".progress", "w") as f:
            f.write(kept)
        with open(res + ".progress", "a") as f:
            f.write('{"point": 2, "row": {"evic')
        stopped = kvsim_run(base + outs(res) + ["--resume"], ok=False, env={"KVSIM_GRID_STOP_AFTER": "2"})
        expect("stopped after 2 points" in stopped, f"{name}: the second stop: {stopped.strip()}")
        with open(res + ".progress", "a") as f:
            f.write('{"point": 4, "r')
        with open(res + ".progress") as f:
            expect(len(f.read().split("\n")) == 6, f"{name}: the progress file holds its header and 4 points")
        kvsim_run(base + outs(res) + ["--resume"])
        expect(rows(res) == want, f"{name}: resumed over a torn progress file: rows differ from the serial run's")
        expect(not os.path.exists(res + ".progress"), f"{name}: the progress file was removed at the end")
        out = kvsim_run(base + outs(res) + ["--resume"])
        expect("nothing to resume" in out, f"{name}: a resume after the end: {out.strip()}")

        if mpirun:
            for n in (2, 3):
                out = os.path.join(workdir, f"grid_{name}_mpi{n}.csv")
                kvsim_run([mpirun, "-np", str(n)] + base + outs(out) + ["--force"])
                expect(rows(out) == want, f"{name}: {n} MPI ranks: rows differ from the serial run's")
            # A serial run's progress file (one point and a torn line) resumed by 3 ranks.
            out = os.path.join(workdir, f"grid_{name}_mpires.csv")
            for p in (out, out[:-4] + ".json"):
                if os.path.exists(p):
                    os.remove(p)
            kvsim_run(base + outs(out) + ["--force"], ok=False, env={"KVSIM_GRID_STOP_AFTER": "1"})
            with open(out + ".progress", "a") as f:
                f.write('{"point": 1, "ro')
            # Without -q: the MPI note on stderr says how many points were kept (-q silences notes).
            log = kvsim_run([mpirun, "-np", "3"] + [a for a in base if a != "-q"] + outs(out) + ["--resume"])
            expect("1 finished earlier" in log, f"{name}: MPI resume did not keep the progress file's point: {log[-300:]}")
            expect(rows(out) == want, f"{name}: MPI resume: rows differ from the serial run's")
    print(f"serve grid check: {'failed' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
