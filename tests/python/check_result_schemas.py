#!/usr/bin/env python3
"""Each result file's schema strings (its banner, its configuration tag, its column names) appear in
its owner module only (results/ for C++, analysis/kvsim_report/readers.py for Python); every other
writer and reader goes through the owner. Fails by exit code, listing each stray use.

usage: check_result_schemas.py ROOT [--self-test]
"""
import pathlib
import shutil
import sys
import tempfile

# string -> the owner modules allowed to spell it (header and source; paths relative to the root)
OWNED = {
    "# config: ": {"results/schema"},
    "# kvsim sweep results": {"results/sweep_file"},
    '"footprint_byte_steps"': {"results/sweep_file"},
    '"layer_out_err"': {"results/detail_file"},
    '"shard_of_requests"': {"results/sweep_file"},
    "# kvsim verify results": {"results/verify_file"},
    '"reference_task_score"': {"results/verify_file"},
    "# kvsim verify agreement": {"results/agreement_file"},
    '"spearman_live_kl"': {"results/agreement_file"},
    "# kvsim serve": {"results/serve_file"},
    "# kvsim chunk deviation": {"results/deviation_file"},
    '"compression_point"': {"results/keep_sets_file"},
}
PY_OWNER = "analysis/kvsim_report/readers.py"
PY_OWNED = ["csv.reader", "csv.DictReader", "pd.read_csv", "json.loads", "json.load("]
CODE = (".cpp", ".h", ".cu", ".cuh")
NOT_PRODUCT = {"tests", "build", "build-sanitize", ".git"}


def strays(root):
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or rel.parts[0] in NOT_PRODUCT or rel.parts[0].startswith("build"):
            continue
        if path.suffix in CODE:
            text = path.read_text(errors="replace")
            for s, owners in OWNED.items():
                if s in text and str(rel.with_suffix("")) not in owners:
                    found.append(f"{rel}: spells {s!r}, which {' / '.join(sorted(owners))} owns")
        elif path.suffix == ".py" and rel.parts[0] == "analysis" and str(rel) != PY_OWNER:
            text = path.read_text(errors="replace")
            for s in PY_OWNED:
                if s in text:
                    found.append(f"{rel}: parses a result file itself ({s}); read it through {PY_OWNER}")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "results").mkdir()
        (root / "results/schema.cpp").write_text('const char* c = "# config: ";\n')
        if strays(root):
            print("self-test: the owner alone was flagged")
            return 1
        (root / "sim").mkdir()
        (root / "sim/x.cpp").write_text('if (line.rfind("# config: ", 0) == 0) {}\n')
        (root / "analysis").mkdir()
        (root / "analysis/table.py").write_text("rows = list(csv.DictReader(f))\n")
        got = strays(root)
        if len(got) != 2:
            print("self-test: expected the two planted strays, got", got)
            return 1
    return 0


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    if "--self-test" in sys.argv[2:] and self_test():
        return 1
    found = strays(root)
    for f in found:
        print(f)
    if found:
        print(f"{len(found)} schema strings outside their owners (docs/result-files.md)")
        return 1
    print("result file schemas: each spelled by its owner only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
