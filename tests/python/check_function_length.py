#!/usr/bin/env python3
"""No long functions: every C++/CUDA function of product code stays within 100 lines (bench/ and
the device harness gpu/parity/: 150); tests/ and fuzz/ are not held to it. Lists each function
over its limit (file:line, name, lines) and exits 1 on any.

Functions are found by brace matching over the source with comments, strings and character
literals blanked: a `{` whose preceding statement text has a parameter list and that opens at
namespace or class scope starts a function (lambdas and blocks inside it count towards it).

usage: check_function_length.py SOURCE_ROOT [--list N | --plants]
  --list N: the N longest, no verdict; --plants: first check the finder on planted functions
"""
import pathlib
import re
import sys
import tempfile

SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
EXEMPT = ("tests", "fuzz")
LIMITS = (("bench/", 150), ("gpu/parity/", 150))
DEFAULT_LIMIT = 100
TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def blank(text):
    """Comments and literals replaced by spaces, newlines kept (so line numbers hold)."""
    return TOKEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def functions(text):
    """(name, first line, last line) of every function body in `text`."""
    code = blank(text)
    stack, out = [], []  # stack of (kind, start line, name)
    stmt_start = 0
    for i, ch in enumerate(code):
        if ch in ";":
            stmt_start = i + 1
        elif ch == "{":
            head = code[stmt_start:i]
            scope = stack[-1][0] if stack else "namespace"
            kind = "block"
            if re.search(r"\bnamespace\b[^()]*$", head) or re.search(r'\bextern\s*$', head):
                kind = "namespace"
            elif scope in ("namespace", "type") and re.search(r"\b(class|struct|union|enum)\b[^()]*$", head):
                kind = "type"
            elif scope in ("namespace", "type") and ")" in head and not re.search(r"=\s*\[", head):
                kind = "function"
            name = ""
            if kind == "function":
                m = re.search(r"([~\w:]+)\s*\(", head)
                name = m.group(1) if m else "?"
                first = head.strip()
                start = code.count("\n", 0, stmt_start + (len(head) - len(head.lstrip()))) + 1 if first else 0
            else:
                start = 0
            stack.append((kind, start, name))
            stmt_start = i + 1
        elif ch == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    out.append((name, start, code.count("\n", 0, i) + 1))
            stmt_start = i + 1
    return out


def limit_for(rel):
    for prefix, n in LIMITS:
        if rel.startswith(prefix):
            return n
    return DEFAULT_LIMIT


def plants():
    """The finder on planted code: a long function (with braces in strings, comments and a lambda),
    a long method in a class, a long one in bench/ under its own limit; a long namespace is no function."""
    body = "\n".join(f'  x += {i}; // }} "{{"' for i in range(101))
    cases = {
        "sim/long.cpp": (f"namespace a {{\nint f(int x) {{\n  auto g = [&] {{ return 1; }};\n{body}\n  return x;\n}}\n}}\n", ["f"]),
        "sim/method.h": (f"struct S {{\n  int m(int x) const {{\n{body}\n    return x;\n  }}\n}};\n", ["m"]),
        "bench/ok.cpp": (f"int main() {{\n  int x = 0;\n{body}\n  return x;\n}}\n", []),
        "core/short.cpp": ("namespace n {\n" + "int v;\n" * 150 + "int f() { return 1; }\n}\n", []),
    }
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for rel, (text, _) in cases.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        over = {(rel, name) for _, rel, _, name, _ in over_limit(root)}
        for rel, (_, names) in cases.items():
            want = {(rel, n) for n in names}
            got = {o for o in over if o[0] == rel}
            if got != want:
                print(f"FAIL plant {rel}: expected {sorted(want)} over the limit, found {sorted(got)}")
                failures += 1
    return failures


def over_limit(root):
    return [f for f in scan(root) if f[0] > f[4]]


def scan(root):
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix not in SOURCES or any(p.startswith(".") or p.startswith("build") for p in path.relative_to(root).parts):
            continue
        if rel.split("/", 1)[0] in EXEMPT:
            continue
        for name, first, last in functions(path.read_text(errors="replace")):
            found.append((last - first + 1, rel, first, name, limit_for(rel)))
    found.sort(reverse=True)
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    failures = plants() if "--plants" in sys.argv else 0
    found = scan(root)
    if "--list" in sys.argv:
        for n, rel, line, name, _ in found[: int(sys.argv[sys.argv.index("--list") + 1])]:
            print(f"{n:5d}  {rel}:{line}  {name}")
        return 0
    over = [f for f in found if f[0] > f[4]]
    for n, rel, line, name, limit in over:
        print(f"{rel}:{line}: {name} is {n} lines (limit {limit}): split it by phase")
    print(f"function length: {len(found)} functions, {len(over)} over their limit")
    return 1 if over or failures else 0


if __name__ == "__main__":
    sys.exit(main())
