#!/usr/bin/env python3
"""Reruns every saved crash input of the fuzz targets and says what and where each one is: the
sanitizer's finding (or the uncaught exception) and the first stack frame outside the sanitizer
runtime, with the library it is in. Inputs that no longer fail are reported as fixed.

usage: fuzz/triage.py BUILD [--fail-outside LIB] [CRASH_FILE...]
  BUILD: a KVSIM_FUZZ=ON build; every crash input in BUILD/fuzz/crashes/TARGET, or the files given.
  --fail-outside LIB: exit 1 when a finding is located anywhere but in library LIB (scripts/fuzz.sh
  gives libhdf5 for fuzz_trace_hdf5, whose unprotected reads reach HDF5's own bugs)."""
import os
import re
import subprocess
import sys

# Frames that are the sanitizer's or the C/C++ runtime's, skipped to find who called them; the libc
# functions ASan intercepts sit in the target's own binary, so they are named here too.
RUNTIME = re.compile(r"__interceptor_|__asan|__sanitizer|__ubsan|__lsan|fuzzer::|libc\.so|libstdc\+\+|"
                     r"raise|abort|__cxa_|std::terminate|__gnu_cxx::__verbose|operator new|malloc|calloc|realloc|"
                     r"^(strdup|strndup|strlen|strnlen|strcpy|strncpy|strcmp|strncmp|memcpy|memmove|memset|memcmp)$")


def classify(output):
    kind = "no failure (fixed)"
    for pat, name in ((r"ERROR: AddressSanitizer: ([\w-]+)", None), (r"ERROR: LeakSanitizer", "leak"),
                      (r"runtime error: (.*)", None), (r"terminate called after throwing an instance of '([^']+)'", None),
                      (r"left open after this input", "HDF5 identifiers left open"),
                      (r"ERROR: libFuzzer: (\S+)", None)):
        m = re.search(pat, output)
        if m:
            kind = name or m.group(1)
            break
    where = ""
    if re.search(r"#\d+ 0x[0-9a-f]+ \(", output) and not re.search(r"#\d+ 0x[0-9a-f]+ in ", output):
        return kind, "unsymbolized (install llvm for llvm-symbolizer)"
    for line in output.splitlines():
        m = re.match(r"\s+#\d+ 0x[0-9a-f]+ in (.+?) \((\S+?)\+0x", line) or re.match(r"\s+#\d+ 0x[0-9a-f]+ +\((\S+?)\+0x", line)
        if not m:
            continue
        func, module = (m.group(1), m.group(2)) if m.lastindex == 2 else ("?", m.group(1))
        if RUNTIME.search(func) or RUNTIME.search(os.path.basename(module)) and "kvsim" not in func:
            continue
        where = f"{func[:90]} [{os.path.basename(module)}]"
        break
    return kind, where


def main():
    build = sys.argv[1]
    args = sys.argv[2:]
    outside = None
    if args[:1] == ["--fail-outside"]:
        outside, args = args[1], args[2:]
    root = os.path.join(build, "fuzz", "crashes")
    files = [(os.path.basename(os.path.dirname(f)), f) for f in args]
    if not files and os.path.isdir(root):
        files = [(t, os.path.join(root, t, n)) for t in sorted(os.listdir(root)) for n in sorted(os.listdir(os.path.join(root, t)))]
    failed = False
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:fast_unwind_on_malloc=0",
           "LSAN_OPTIONS": "suppressions=" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "lsan.supp")}
    for target, path in files:
        # The fuzz runs' limits (scripts/fuzz.sh), not libFuzzer's defaults.
        cmd = [os.path.join(build, "fuzz", target), "-timeout=30", "-rss_limit_mb=4096", path]
        run = lambda e: subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)  # noqa: E731
        try:
            p = run(env)
        except subprocess.TimeoutExpired:
            print(f"{target}\t{os.path.basename(path)[:18]}\t{os.path.getsize(path)} B\tno end in 300 s\t")
            failed = failed or outside is not None
            continue
        kind, where = classify(p.stdout + p.stderr) if p.returncode else ("no failure (fixed)", "")
        if not p.returncode:
            q = run({**env, "LSAN_OPTIONS": ""})
            if q.returncode:
                kind, where = classify(q.stdout + q.stderr)
                kind = f"{kind}, suppressed (fuzz/lsan.supp)"
        print(f"{target}\t{os.path.basename(path)[:18]}\t{os.path.getsize(path)} B\t{kind}\t{where}")
        if outside and p.returncode and outside not in where:
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
