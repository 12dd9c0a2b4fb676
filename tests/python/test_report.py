#!/usr/bin/env python3
"""The report's readers (analysis/kvsim_report/readers.py) on small fixtures: each file kind is
recognised from its content, frames hold what the files hold, config means are right, and bad
input names the file and what was expected.

Usage: test_report.py ANALYSIS_DIR FIXTURE_DIR
"""
import json
import os
import sys
import tempfile
import unittest

ANALYSIS, FIX = sys.argv[1], sys.argv[2]
sys.path.insert(0, ANALYSIS)
from kvsim_report.readers import (InputError, config_means, read_csv, read_detail, read_inputs, read_json,  # noqa: E402
                                  read_records)
from kvsim_report.plots import frontier  # noqa: E402
from kvsim_report.agreement_plot import spearman  # noqa: E402


def fx(name):
    return os.path.join(FIX, name)


class Readers(unittest.TestCase):
    def test_kinds_from_content(self):
        self.assertEqual(read_csv(fx("sweep.csv"))[0], "sweep")
        self.assertEqual(read_csv(fx("verify.csv"))[0], "verify")
        self.assertEqual(read_csv(fx("agreement.csv"))[0], "agreement")
        self.assertEqual(read_csv(fx("serve_hits.csv"))[0], "serve_hits")

    def test_sweep_frame(self):
        _, df = read_csv(fx("sweep.csv"))
        self.assertEqual(len(df), 2 * 3 * 13)  # modes x requests x (4 policies x 3 budgets + full)
        self.assertEqual(df["params"].iloc[0], "")  # full's empty params stay empty, not NaN
        self.assertTrue(df.loc[df["mode"] == "query-agnostic", "est_kl"].isna().all())
        self.assertFalse(df.loc[df["mode"] == "query-aware", "est_kl"].isna().any())

    def test_config_means(self):
        _, df = read_csv(fx("verify.csv"))
        m = config_means(df, ["live_kl"])
        self.assertEqual(len(m), 13)
        row = m[(m["policy"] == "kivi") & (m["budget"] == 0.25)].iloc[0]
        sub = df[(df["policy"] == "kivi") & (df["budget"] == 0.25)]
        self.assertAlmostEqual(row["live_kl"], sub["live_kl"].mean())
        self.assertAlmostEqual(row["bytes_ratio"], 0.2475)  # 0.99 x 0.25 of the full bytes

    def test_detail(self):
        d = read_detail(fx("sweep.jsonl"))
        self.assertEqual(len(d), 3 * 13)  # the configuration line skipped
        self.assertEqual(len(d["head_kl"].iloc[1]), 4)
        self.assertEqual(len(d["head_kl"].iloc[1][0]), 3)

    def test_read_inputs_sorts_by_kind(self):
        inp = read_inputs([fx("sweep.csv"), fx("verify.csv"), fx("agreement.csv"), fx("sweep.jsonl"), fx("serve_hits.csv")])
        self.assertEqual(inp.kinds(), ["sweep", "verify", "agreement", "detail", "serve_hits"])

    def test_serve_json(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"trace": "t.jsonl", "profile": "p", "results": [
                {"eviction": "lru", "hbm_gb": 8, "kv_policy": "none", "hit_rate": 0.4, "ttft_p50_ms": 10,
                 "ttft_centiles_ms": [1, 2, 3]}]}, f)
        kind, df = read_json(f.name)
        self.assertEqual(kind, "serve_sim")
        self.assertEqual(df["profile"].iloc[0], "p")  # summary fields repeated on the rows
        self.assertEqual(df["ttft_centiles_ms"].iloc[0], [1, 2, 3])

    def test_bad_input_names_file_and_expectation(self):
        with self.assertRaises(InputError) as e:
            read_csv(fx("missing_column.csv"))
        self.assertIn("missing_column.csv", str(e.exception))
        self.assertIn("'mode'", str(e.exception))
        self.assertIn("budget_bytes", str(e.exception))
        with self.assertRaises(InputError) as e:
            read_csv(fx("unknown.csv"))
        self.assertIn("unknown.csv: a CSV with columns a, b, c", str(e.exception))
        self.assertIn("expected a kvsim sweep, verify", str(e.exception))
        with self.assertRaises(InputError) as e:
            read_inputs([fx("README.md")])
        self.assertIn("unknown file kind '.md'", str(e.exception))
        with self.assertRaises(InputError) as e:
            read_inputs([fx("nothing.csv")])
        self.assertIn("nothing.csv: no such file", str(e.exception))
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"request": "r0", "policy": "snapkv"}\n')
        with self.assertRaises(InputError) as e:
            read_detail(f.name)
        self.assertIn(":1: no field 'budget'", str(e.exception))
        from kvsim_report.plots import head_heatmaps
        with self.assertRaises(InputError) as e:
            head_heatmaps(read_inputs([fx("sweep.jsonl")]), "snapkv:window=32@x")
        self.assertIn("expected LABEL@BUDGET", str(e.exception))
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"request": "r0", "policy": "full", "budget": 1, "layer_kl": [0, 0]}\n')
        with self.assertRaises(InputError) as e:
            head_heatmaps(read_inputs([f.name]))
        self.assertIn("only full-cache or oracle rows", str(e.exception))


class Schemas(unittest.TestCase):
    """A file of a newer schema than the reader knows is refused by name; older ones read."""

    def write(self, suffix, text):
        with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as f:
            f.write(text)
        return f.name

    def test_newer_sweep_refused_older_read(self):
        with open(fx("sweep.csv")) as f:
            lines = f.read().split("\n")
        config = [i for i, line in enumerate(lines) if line.startswith("# config: ")][0]
        j = json.loads(lines[config][len("# config: "):])
        for schema, ok in ((None, True), (2, True), (3, False)):
            j.pop("schema", None)
            if schema:
                j["schema"] = schema
            lines[config] = "# config: " + json.dumps(j)
            path = self.write(".csv", "\n".join(lines))
            if ok:
                self.assertEqual(read_csv(path)[0], "sweep")
                self.assertEqual(len(read_records(path)), 2 * 3 * 13)
            else:
                with self.assertRaises(InputError) as e:
                    read_csv(path)
                self.assertIn(path, str(e.exception))
                self.assertIn("schema 3", str(e.exception))

    def test_quoted_lines_starting_with_hash_stay(self):
        # Verify's generated text is a quoted field that may hold a line starting with '#'; only the
        # comment lines before the header are comments.
        with open(fx("verify.csv")) as f:
            lines = f.read().rstrip("\n").split("\n")
        lines[-1] = lines[-1][: lines[-1].rindex(",") + 1] + '"an answer\n# a heading the model wrote\nmore"'
        path = self.write(".csv", "\n".join(lines) + "\n")
        rows = read_records(path)
        self.assertEqual(rows[-1]["generated"], "an answer\n# a heading the model wrote\nmore")
        self.assertEqual(rows[-1]["budget"], lines[-1].split(",")[5])

    def test_newer_banner_and_json_refused(self):
        path = self.write(".csv", "# kvsim serve hit-rate results (schema 7): one row per grid point\n"
                                  "eviction,capacity_blocks,block_hit_rate\nlru,10,0.5\n")
        with self.assertRaises(InputError) as e:
            read_csv(path)
        self.assertIn("schema 7", str(e.exception))
        path = self.write(".json", json.dumps({"schema": 9, "results": [{"eviction": "lru", "capacity_blocks": 1,
                                                                          "block_hit_rate": 0.5}]}))
        with self.assertRaises(InputError) as e:
            read_json(path)
        self.assertIn("schema 9", str(e.exception))


class ModelFiles(unittest.TestCase):
    def test_curve_read_and_drawn(self):
        import h5py
        from kvsim_report.page import build_report
        d = tempfile.mkdtemp()
        path = os.path.join(d, "model.h5")
        with h5py.File(path, "w") as f:
            f.attrs["format"] = "kvsim-learned-policy"
            f.attrs["method"] = "foresight"
            c = f.create_group("curve")
            c.attrs["metric"] = "pairwise_hinge"
            c["step"] = [1.0, 2.0, 3.0]
            c["value"] = [0.9, 0.5, 0.4]
        inp = read_inputs([path])
        self.assertEqual(inp.kinds(), ["models"])
        self.assertEqual(inp.models[0]["metric"], "pairwise_hinge")
        self.assertEqual(list(inp.models[0]["value"]), [0.9, 0.5, 0.4])
        pngs = build_report([path], os.path.join(d, "r.html"))
        self.assertEqual([os.path.basename(p) for p in pngs], ["01_training_foresight.png"])
        with h5py.File(os.path.join(d, "other.h5"), "w") as f:
            f.attrs["format"] = "something"
        with self.assertRaises(InputError) as e:
            read_inputs([os.path.join(d, "other.h5")])
        self.assertIn("without format 'kvtrace' or a /curve group", str(e.exception))


class Helpers(unittest.TestCase):
    def test_frontier(self):
        pts = [(0.1, 0.5), (0.25, 0.2), (0.2, 0.6), (0.5, 0.1), (0.5, 0.3)]
        self.assertEqual(frontier(pts), [(0.1, 0.5), (0.25, 0.2), (0.5, 0.1)])
        self.assertEqual(frontier([(0.1, 1), (0.2, 0), (0.3, 2)], lower=False), [(0.1, 1), (0.3, 2)])
        # Equal bytes: only the better of the two is on the frontier, either way round.
        self.assertEqual(frontier([(0.1, 0.33), (0.1, 0.67)], lower=False), [(0.1, 0.67)])
        self.assertEqual(frontier([(0.1, 0.67), (0.1, 0.33)]), [(0.1, 0.33)])

    def test_spearman(self):
        self.assertAlmostEqual(spearman([1, 2, 3, 4], [10, 20, 30, 40]), 1.0)
        self.assertAlmostEqual(spearman([1, 2, 3, 4], [4, 3, 2, 1]), -1.0)
        self.assertAlmostEqual(spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]), 0.8)


if __name__ == "__main__":
    result = unittest.main(argv=[sys.argv[0]], exit=False).result
    ok = result.wasSuccessful()
    print("report readers:", "passed" if ok else "failed")
    sys.exit(0 if ok else 1)
