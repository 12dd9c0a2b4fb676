#!/usr/bin/env python3
"""The tree stays formatted: every C++/CUDA source (not build folders) must be what clang-format
makes of it under the repository's .clang-format. Prints each file that is not, and how to fix it;
exits 1 on any, and 1 when clang-format is missing (scripts/setup.sh installs it).

usage: check_format.py SOURCE_ROOT [--fix]
"""
import pathlib
import shutil
import subprocess
import sys

SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")


def sources(root):
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix in SOURCES and not any(p.startswith(".") or p.startswith("build") for p in rel.parts):
            yield path


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    tool = shutil.which("clang-format")
    if not tool:
        print("format: clang-format is not installed (scripts/setup.sh installs Debian's clang-format)")
        return 1
    files = list(sources(root))
    if "--fix" in sys.argv:
        subprocess.run([tool, "-i", *map(str, files)], check=True)
    bad = []
    for path in files:
        formatted = subprocess.run([tool, str(path)], capture_output=True, check=True).stdout
        if formatted != path.read_bytes():
            bad.append(path.relative_to(root))
    for rel in bad:
        print(f"{rel}: not formatted (clang-format -i {rel})")
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"format: {len(files)} files, {len(bad)} not formatted ({version})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
