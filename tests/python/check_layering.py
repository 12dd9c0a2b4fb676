#!/usr/bin/env python3
"""The layering check: includes and CMake links must follow the allowed graph.

The graph is written once, in docs/architecture.md, in the fenced block tagged `layers`: one line
per module, `module: the modules it may use` (`*`: any). A module is a top-level folder or a
sub-folder named on its own line (`gpu/parity`); a file belongs to the longest module that holds
it, and a module may always use itself. The check fails (exit 1, one line per problem) on:

- an include of another module's file that the graph does not allow, in any form: "dir/x.h",
  <dir/x.h>, "../dir/x.h" or a path relative to the including file;
- a CUDA source (.cu, .cuh) including a third-party header (only CUDA and the standard library);
- a `target_link_libraries` from a library or executable of one module to a kvsim library of a
  module the graph does not allow (the defining CMakeLists.txt's folder is the target's module);
- a declared graph that names an unknown module, lets a module use a `*` module, or has a cycle.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]).resolve()
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
CUDA_FORBIDDEN = ("Eigen/", "hdf5", "H5", "boost/", "nlohmann/", "pcre2")
DOC = "docs/architecture.md"


def read_graph():
    doc = ROOT / DOC
    m = re.search(r"```layers\n(.*?)```", doc.read_text(), re.S)
    if not m:
        sys.exit(f"{doc}: no ```layers block (the allowed include graph)")
    graph = {}
    for n, line in enumerate(m.group(1).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" not in line:
            sys.exit(f"{doc}: layers line {n}: expected 'module: allowed modules', got {line!r}")
        module, allowed = line.split(":", 1)
        graph[module.strip()] = set(allowed.split())
    return graph


def graph_problems(graph):
    """The declared graph itself: known names, `*` modules as leaves, no cycle."""
    problems = []
    for module, allowed in graph.items():
        for dep in sorted(allowed - {"*"}):
            if dep not in graph:
                problems.append(f"{DOC}: layers: {module} may use '{dep}', which is no module of the block")
            elif "*" in graph[dep]:
                problems.append(f"{DOC}: layers: {module} may use {dep}, but {dep} may use anything (*): "
                                "nothing may sit above a * module")
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dep in sorted(graph[module] - {"*", module}):
            if dep not in graph or "*" in graph[dep]:
                continue
            if state.get(dep) == "open":
                cycle = stack[stack.index(dep):] + [dep]
                problems.append(f"{DOC}: layers: cycle {' -> '.join(cycle)}")
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state and "*" not in graph[module]:
            visit(module)
    return problems


def module_of(rel, graph):
    """The longest module holding `rel` (a path relative to ROOT), or None."""
    parts = pathlib.PurePosixPath(rel).parts
    for k in range(len(parts), 0, -1):
        key = "/".join(parts[:k])
        if key in graph:
            return key
    return None


def target_module(path, target, folders, graph):
    """The module an include target resolves to, or None for a header outside the project."""
    local = (path.parent / target).resolve()
    if local.is_file() and local.is_relative_to(ROOT):
        return module_of(local.relative_to(ROOT).as_posix(), graph)
    first = pathlib.PurePosixPath(target).parts[0] if target else ""
    if first in folders:
        return module_of(target, graph) or first
    return None


def allows(graph, module, dep):
    allowed = graph.get(module, set())
    return dep == module or "*" in allowed or dep in allowed


def skipped(rel):
    return any(part.startswith(".") or part.startswith("build") for part in rel.parts)


def include_problems(graph, folders):
    problems, files = [], 0
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if path.suffix not in SOURCES or rel.parts[0] not in folders or skipped(rel):
            continue
        module = module_of(rel.as_posix(), graph)
        if module is None:
            problems.append(f"{rel}: folder '{rel.parts[0]}' is not in the layers block of {DOC}")
            continue
        files += 1
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(2).strip()
            if path.suffix in (".cu", ".cuh") and any(target.startswith(f) for f in CUDA_FORBIDDEN):
                problems.append(f"{rel}:{n}: includes <{target}>: CUDA sources see only CUDA and the standard library")
            dep = target_module(path, target, folders, graph)
            if dep is not None and not allows(graph, module, dep):
                problems.append(f"{rel}:{n}: includes {m.group(1)}{target}, which is {dep}/, but {module}/ may use "
                                f"only {', '.join(sorted(graph[module] | {module}))} ({DOC}, layers)")
    return problems, files


CALL = re.compile(r"\b(add_library|add_executable|target_link_libraries)\s*\(([^)]*)\)", re.S)


def cmake_files():
    return [p for p in sorted(ROOT.rglob("CMakeLists.txt")) if not skipped(p.relative_to(ROOT))]


def link_problems(graph):
    """Every target_link_libraries edge between kvsim targets against the graph."""
    owner, calls = {}, []
    for cm in cmake_files():
        rel = cm.parent.relative_to(ROOT).as_posix()
        module = "" if rel == "." else module_of(rel, graph)
        text = re.sub(r"#[^\n]*", "", cm.read_text())
        for m in CALL.finditer(text):
            args = m.group(2).split()
            if not args:
                continue
            line = text.count("\n", 0, m.start()) + 1
            if m.group(1) == "target_link_libraries":
                calls.append((cm, line, module, args[0], " ".join(args[1:])))
            else:
                owner[args[0]] = module
    problems = []
    for cm, line, module, target, rest in calls:
        src = owner.get(target, module)
        for lib in re.findall(r"\b(kvsim_[A-Za-z0-9_]+)", rest):
            dep = owner.get(lib)
            if not dep or src is None or allows(graph, src, dep):
                continue
            problems.append(f"{cm.relative_to(ROOT)}:{line}: {target} ({src}/) links {lib} ({dep}/), but {src}/ may use "
                            f"only {', '.join(sorted(graph[src] | {src}))} ({DOC}, layers)")
    return problems


def main():
    graph = read_graph()
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    problems = graph_problems(graph)
    more, files = include_problems(graph, folders)
    problems += more + link_problems(graph)
    for p in problems:
        print(p)
    print(f"layering: {files} files, {len(problems)} violations")
    if not files:
        print("layering: no sources found")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
