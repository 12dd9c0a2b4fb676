#!/usr/bin/env python3
"""The layering check: every #include "folder/..." in the sources must follow the allowed graph.

The graph is written once, in docs/architecture.md, in the fenced block tagged `layers`: one line
per folder, `folder: the folders it may include` (`*`: any). A folder may always include itself.
CUDA sources (.cu, .cuh) may also include no third-party headers but CUDA's and the standard
library's. Prints one line per violation (file:line: what and why) and exits 1 on any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
CUDA_FORBIDDEN = ("Eigen/", "hdf5", "H5", "boost/", "nlohmann/", "pcre2")


def read_graph():
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text()
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    if not m:
        sys.exit(f"{doc}: no ```layers block (the allowed include graph)")
    graph = {}
    for n, line in enumerate(m.group(1).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" not in line:
            sys.exit(f"{doc}: layers line {n}: expected 'folder: allowed folders', got {line!r}")
        folder, allowed = line.split(":", 1)
        graph[folder.strip()] = set(allowed.split())
    return graph


def main():
    graph = read_graph()
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    problems, files = [], 0
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if path.suffix not in SOURCES or rel.parts[0] not in folders or rel.parts[0] == "build":
            continue
        if any(part.startswith(".") or part.startswith("build") for part in rel.parts):
            continue
        top = rel.parts[0]
        if top not in graph:
            problems.append(f"{rel}: folder '{top}' is not in the layers block of docs/architecture.md")
            continue
        files += 1
        allowed = graph[top] | {top}
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, target = m.groups()
            if path.suffix in (".cu", ".cuh") and any(target.startswith(f) for f in CUDA_FORBIDDEN):
                problems.append(f"{rel}:{n}: includes <{target}>: CUDA sources see only CUDA and the standard library")
            if kind != '"' or "/" not in target:
                continue
            dep = target.split("/", 1)[0]
            if dep in folders and dep not in allowed and "*" not in allowed:
                problems.append(f"{rel}:{n}: includes \"{target}\", but {top}/ may include only "
                                f"{', '.join(sorted(allowed)) or 'itself'} (docs/architecture.md, layers)")
    for p in problems:
        print(p)
    print(f"layering: {files} files, {len(problems)} violations")
    if not files:
        print("layering: no sources found")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
