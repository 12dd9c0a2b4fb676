#!/usr/bin/env python3
"""Common flags mean the same everywhere (cli/README.md): every kvsim subcommand that writes a file
(its --help offers -o/--out) takes --force and -q/--quiet, found by walking `kvsim --help` and each
group's own list, so a new subcommand cannot forget them. Then the promise behind --force: an
existing output is refused without it and replaced with it, for a command of each kind.

usage: check_common_flags.py KVSIM SCRATCH_DIR
"""
import pathlib
import re
import shutil
import subprocess
import sys

KVSIM, SCRATCH = sys.argv[1], pathlib.Path(sys.argv[2])


def run(*args):
    return subprocess.run([KVSIM, *args], capture_output=True, text=True, timeout=300)


def commands(prefix=()):
    """Every leaf subcommand, as a tuple of words, from the 'commands:' lists of the help."""
    p = run(*prefix, "--help")
    text = p.stdout + p.stderr
    if "commands:" not in text:
        return [tuple(prefix)]
    names = re.findall(r"^  (\S+)\s{2,}\S", text.split("commands:", 1)[1], re.M)
    return [leaf for name in names for leaf in commands((*prefix, name))]


def main():
    shutil.rmtree(SCRATCH, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    failures, writers = [], []
    leaves = commands() + [("sweep", "merge")]  # sweep is a command with a subcommand of its own
    for cmd in leaves:
        help_text = run(*cmd, "--help").stdout
        if not re.search(r"(-o \[ --out \]|--out\b)", help_text):
            continue
        writers.append(" ".join(cmd))
        for flag, pattern in (("--force", r"--force\b"), ("-q/--quiet", r"-q \[ --quiet \]|-q, --quiet")):
            if not re.search(pattern, help_text):
                failures.append(f"kvsim {' '.join(cmd)} writes a file but its --help has no {flag}")
    # --force honoured: a synthetic trace, a basis fitted on it, and a report (Python) of a sweep.
    trace, basis = SCRATCH / "t.h5", SCRATCH / "t.basis"
    small = ["--layers", "2", "--q-heads", "2", "--kv-heads", "1", "--head-dim", "16", "--context", "32",
             "--requests", "1"]
    sweep = SCRATCH / "s.csv"
    steps = [("trace synth", ["trace", "synth", "-o", str(trace), *small], trace),
             ("trace fit-basis", ["trace", "fit-basis", "-o", str(basis), str(trace)], basis),
             ("sweep", ["sweep", str(trace), "-p", "snapkv", "-b", "0.5", "-o", str(sweep), "-q"], sweep),
             ("report", ["report", str(sweep), "-o", str(SCRATCH / "r.html"), "-q"], SCRATCH / "r.html")]
    for name, args, out in steps:
        first = run(*args)
        if first.returncode != 0:
            failures.append(f"{name}: first run failed: {first.stderr.strip()[-300:]}")
            continue
        again = run(*args)
        if again.returncode != 1 or "--force" not in again.stderr:
            failures.append(f"{name}: an existing {out.name} was not refused naming --force "
                            f"(exit {again.returncode}: {again.stderr.strip()[-200:]})")
        forced = run(*args, "--force")
        if forced.returncode != 0:
            failures.append(f"{name} --force: exit {forced.returncode}: {forced.stderr.strip()[-200:]}")
    for f in failures:
        print("FAIL", f)
    print(f"common flags: {len(leaves)} subcommands, {len(writers)} write files ({', '.join(writers)}); "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
