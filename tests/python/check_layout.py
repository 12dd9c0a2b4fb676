#!/usr/bin/env python3
"""The README's layout table cannot be forgotten: every top-level folder of the tree needs a row
`| \`folder/\` |` in README.md's Layout section and a README.md of its own, and every row must
name a folder that exists. Prints one line per problem; exit 1 on any.

usage: check_layout.py SOURCE_ROOT [--plants]
--plants first checks the check: a folder without a row, a folder without a README and a row
without a folder, each planted in a scratch tree, must each be reported.
"""
import pathlib
import re
import subprocess
import sys
import tempfile


def git_ignored(root, name):
    """A folder git ignores (an experiment's out/, say) is not part of the tree."""
    try:
        r = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", name + "/"], capture_output=True)
    except OSError:
        return False
    return r.returncode == 0


def problems_of(root):
    """The problems of the tree at `root`, and how many folders it has."""
    text = (root / "README.md").read_text()
    m = re.search(r"^## Layout\n(.*?)(?=^## )", text, re.S | re.M)
    if not m:
        return ["README.md: no '## Layout' section"], 0
    rows = set(re.findall(r"^\| `([^`/]+)/` \|", m.group(1), re.M))
    folders = {p.name for p in root.iterdir()
               if p.is_dir() and not p.name.startswith(".") and not p.name.startswith("build")
               and not git_ignored(root, p.name)}
    problems = []
    for f in sorted(folders - rows):
        problems.append(f"README.md: Layout has no row for {f}/ (add '| `{f}/` | what is there now |')")
    for f in sorted(rows - folders):
        problems.append(f"README.md: Layout has a row for {f}/, which is no folder of the tree")
    for f in sorted(folders):
        if not (root / f / "README.md").is_file():
            problems.append(f"{f}/: no README.md (each folder's README says what is in it now)")
    return problems, len(folders)


def plants():
    """Each kind of omission, planted in a scratch tree, must be reported."""
    readme = "# x\n\n## Layout\n\n| folder | what |\n|---|---|\n| `a/` | a |\n| `b/` | b |\n\n## Next\n"
    cases = [("a folder without a row", ["a", "b", "c"], "no row for c/"),
             ("a folder without a README", ["a", "b"], "b/: no README.md"),
             ("a row without a folder", ["a"], "a row for b/, which is no folder")]
    failures = 0
    for name, folders, expected in cases:
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            (root / "README.md").write_text(readme)
            for f in folders:
                (root / f).mkdir()
                if not (name == "a folder without a README" and f == "b"):
                    (root / f / "README.md").write_text(f"# {f}/\n")
            found = problems_of(root)[0]
            if not any(expected in p for p in found):
                print(f"FAIL plant: {name}: expected {expected!r} among {found}")
                failures += 1
    return failures


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    failures = plants() if "--plants" in sys.argv[2:] else 0
    problems, folders = problems_of(root)
    for p in problems:
        print(p)
    print(f"layout: {folders} folders, {len(problems)} problems")
    return 1 if problems or failures else 0


if __name__ == "__main__":
    sys.exit(main())
