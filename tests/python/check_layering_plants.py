#!/usr/bin/env python3
"""The layering check must catch every kind of violation: each is planted in a copy of the tree,
the check must then exit 1 naming it, and the untouched copy must pass (exit 0).

usage: check_layering_plants.py CHECK_LAYERING_PY SOURCE_ROOT
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

CHECK, SOURCE = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
KEEP = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".txt", ".md"}


def copy_tree(dst):
    for path in SOURCE.rglob("*"):
        rel = path.relative_to(SOURCE)
        if any(p.startswith(".") or p.startswith("build") for p in rel.parts):
            continue
        if path.is_file() and path.suffix in KEEP:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dst / rel)


def append(rel, text):
    return lambda root: (root / rel).write_text((root / rel).read_text() + text)


def replace(rel, old, new):
    def plant(root):
        text = (root / rel).read_text()
        if old not in text:
            raise SystemExit(f"plant: {rel} no longer holds {old!r}; update this test")
        (root / rel).write_text(text.replace(old, new, 1))
    return plant


LAYERS = "docs/architecture.md"
PLANTS = [
    ("quoted include", append("sim/replay.cpp", '#include "verify/agreement.h"\n'),
     'includes "verify/agreement.h, which is verify/'),
    ("angle include", append("sim/replay.cpp", "#include <verify/agreement.h>\n"), "<verify/agreement.h"),
    ("parent-relative include", append("sim/replay.cpp", '#include "../verify/agreement.h"\n'), "../verify/agreement.h"),
    ("sibling-relative include", append("kvcache/budget.cpp", '#include "../learned/mlp.h"\n'), "which is learned/"),
    ("product gpu/ includes the harness", append("gpu/packed_rows.cpp", '#include "gpu/parity/nmse.h"\n'),
     "which is gpu/parity/"),
    ("harness included relative to gpu/", append("gpu/packed_rows.cpp", '#include "parity/nmse.h"\n'),
     "which is gpu/parity/"),
    ("a CUDA source with a third-party header", append("gpu/packed_unpack.cu", "#include <Eigen/Dense>\n"),
     "CUDA sources see only CUDA"),
    ("cycle in the declared graph", replace(LAYERS, "core:  ", "core: sim "), "cycle"),
    ("a module above a * module", replace(LAYERS, "sim: core ", "sim: cli core "), "nothing may sit above"),
    ("an unknown module in the graph", replace(LAYERS, "sim: core ", "sim: simulation core "), "no module"),
    ("a CMake link against the graph", append("sim/CMakeLists.txt", "target_link_libraries(kvsim_sim PUBLIC kvsim_verify)\n"),
     "kvsim_sim (sim/) links kvsim_verify"),
    ("a CMake link from a sub-module", append("gpu/CMakeLists.txt",
                                             "target_link_libraries(kvsim_gpu_ref PRIVATE kvsim_gpu_parity)\n"),
     "links kvsim_gpu_parity (gpu/parity/)"),
    ("a folder missing from the graph", lambda root: (root / "newdir").mkdir() or (root / "newdir" / "x.cpp").write_text(""),
     "folder 'newdir' is not in the layers block"),
]


def run(root):
    p = subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        clean = pathlib.Path(tmp) / "clean"
        copy_tree(clean)
        rc, out = run(clean)
        if rc != 0:
            print(f"FAIL: the untouched tree does not pass (exit {rc}):\n{out}")
            failures += 1
        for n, (name, plant, expected) in enumerate(PLANTS):
            root = pathlib.Path(tmp) / f"plant{n}"
            shutil.copytree(clean, root)
            plant(root)
            rc, out = run(root)
            ok = rc == 1 and expected in out
            print(f"{'ok' if ok else 'FAIL'}: {name} -> exit {rc}")
            if not ok:
                print(f"  expected exit 1 and {expected!r} in:\n{out}")
                failures += 1
            shutil.rmtree(root)
    print(f"layering plants: {len(PLANTS)} planted, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
