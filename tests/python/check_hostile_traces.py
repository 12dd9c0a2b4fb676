#!/usr/bin/env python3
"""A hostile trace never takes a command down. make_hostile_traces.py writes the inputs on which
HDF5 1.10 itself reads out of bounds or crashes (found by fuzz_trace_hdf5, which reads traces
unprotected, each reduced to one changed byte of the writer's smallest trace). Each trace-reading command must refuse each one with exit 1 and an
error naming the file, never die by a signal: the open walks the file in a forked child first
(traces/trace_probe.h).

In a sanitizer build (--strict) every out-of-bounds read HDF5 makes in the probe's child ends it,
so `sweep` and `trace check` must end in that named error (exit 1) on every file. Without one, an
out-of-bounds read that happens not to fault goes unnoticed by HDF5 itself; the command then reads
what HDF5 returned (checksums still guard every K/V/Q chunk), so it may succeed, `trace check`
included. Any command that fails must name the file, and none may die by a signal.

usage: check_hostile_traces.py KVSIM SCRATCH_DIR [--strict]
"""
import pathlib
import shutil
import subprocess
import sys

KVSIM, SCRATCH = sys.argv[1], pathlib.Path(sys.argv[2])
HOSTILE = SCRATCH / "made"
STRICT = "--strict" in sys.argv[3:]
MUST_FAIL = {"trace check", "sweep"} if STRICT else set()


def commands(trace, out):
    return {
        "sweep": [KVSIM, "sweep", trace, "-p", "snapkv,h2o,kivi", "-b", "0.5", "-o", f"{out}/sweep.csv", "--force", "-q"],
        "trace info": [KVSIM, "trace", "info", trace],
        "trace check": [KVSIM, "trace", "check", trace],
        "trace dump": [KVSIM, "trace", "dump", trace, "--request", "r0", "--tensor", "k", "--layer", "0"],
        "trace keep-sets": [KVSIM, "trace", "keep-sets", trace, "-p", "snapkv", "-b", "0.5", "-l", "0",
                            "-o", f"{out}/keep.json", "--force"],
        "trace fit-basis": [KVSIM, "trace", "fit-basis", "-o", f"{out}/basis", "--force", trace],
    }


def main():
    shutil.rmtree(SCRATCH, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("make_hostile_traces.py")), KVSIM, str(HOSTILE)],
                   check=True)
    files = sorted(HOSTILE.glob("*.h5"))
    if not files:
        print(f"no hostile traces in {HOSTILE}")
        return 1
    failures = runs = 0
    for f in files:
        # A copy per file: a command must not change its input, and the name in the error is ours.
        trace = str(SCRATCH / f.name)
        shutil.copyfile(f, trace)
        for name, cmd in commands(trace, SCRATCH).items():
            runs += 1
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            said = (p.stdout + p.stderr).strip()
            if p.returncode < 0:
                failures += 1
                print(f"FAIL {f.name}: {name} died by signal {-p.returncode}: {said[-400:]}")
            elif p.returncode not in (0, 1) or (p.returncode == 1 and trace not in said):
                failures += 1
                print(f"FAIL {f.name}: {name} exited {p.returncode}, expected 0, or 1 with an error naming {trace}: "
                      f"{said[-400:]}")
            elif p.returncode == 0 and name in MUST_FAIL:
                failures += 1
                print(f"FAIL {f.name}: {name} accepted a hostile file (exit 0){' in a sanitizer build' * STRICT}: "
                      f"{said[-300:]}")
        if f.read_bytes() != pathlib.Path(trace).read_bytes():
            failures += 1
            print(f"FAIL {f.name}: a command changed its input file")
    print(f"hostile traces: {len(files)} files, {runs} command runs{' (strict)' * STRICT}, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
