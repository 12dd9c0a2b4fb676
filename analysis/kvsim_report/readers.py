"""The report's inputs: what kind of file each one is, and its contents as pandas frames.

Kinds (detected from the content, not the name):
  sweep       kvsim sweep CSV           verify      kvsim verify CSV
  agreement   kvsim agreement CSV       detail      kvsim sweep --detail JSONL
  serve_sim   kvsim serve simulate CSV or JSON summary
  serve_hits  kvsim serve hit-rate CSV or JSON summary
  keep_sets   kvsim trace keep-sets JSON
  trace       kvtrace HDF5              model       learned-policy model file (HDF5 with /curve)
A file of no known kind, or one missing a column its kind needs, raises InputError naming the file
and what was expected. This is analysis/'s one reader of kvsim's result files (docs/result-files.md):
a file of a newer schema than SCHEMAS names is refused; older ones read as documented there.
"""
import csv
import io
import json
import os
import re
from dataclasses import dataclass, field

import pandas as pd

CSV_KINDS = {
    # kind: (columns that identify it, columns the report reads)
    "sweep": ({"trace", "request", "policy", "mean_kl", "compressed_bytes"},
              ["request", "mode", "policy", "params", "budget", "mean_kl", "compressed_bytes", "budget_bytes"]),
    "verify": ({"request", "policy", "live_kl"},
               ["request", "mode", "policy", "params", "budget", "live_kl", "compressed_bytes", "budget_bytes"]),
    "agreement": ({"offline_metric", "spearman_live_kl"}, ["offline_metric", "spearman_live_kl"]),
    "serve_sim": ({"eviction", "hbm_gb", "ttft_p50_ms"}, ["eviction", "hbm_gb", "kv_policy", "hit_rate", "ttft_p50_ms"]),
    "serve_hits": ({"eviction", "capacity_blocks", "block_hit_rate"}, ["eviction", "capacity_blocks", "block_hit_rate"]),
}
# The newest schema of each kind this reader knows (results/*.h in the C++ owns the numbers).
SCHEMAS = {"sweep": 2, "verify": 2, "agreement": 2, "detail": 2, "serve_sim": 2, "serve_hits": 2, "keep_sets": 2}
EXPECTED = ("a kvsim sweep, verify, agreement or serve CSV; a sweep --detail JSONL; a serve or trace keep-sets "
            "JSON; a kvtrace or learned-model .h5")


class InputError(Exception):
    """Bad input: the message names the file and what was expected."""


@dataclass
class Inputs:
    sweep: list = field(default_factory=list)       # DataFrames
    verify: list = field(default_factory=list)
    agreement: list = field(default_factory=list)   # (path, DataFrame)
    detail: list = field(default_factory=list)      # DataFrames: one row per (request, config)
    serve_sim: list = field(default_factory=list)   # DataFrames (JSON summaries keep their CDFs)
    serve_hits: list = field(default_factory=list)
    keep_sets: list = field(default_factory=list)   # dicts
    traces: list = field(default_factory=list)      # paths
    models: list = field(default_factory=list)      # dicts: path, method, metric, step, value

    def kinds(self):
        return [k for k in ("sweep", "verify", "agreement", "detail", "serve_sim", "serve_hits", "keep_sets", "traces",
                            "models") if getattr(self, k)]


def _csv_text(path):
    """The CSV without its leading '#' comment lines, the header's columns, and the comment lines."""
    with open(path, newline="") as f:
        lines = f.readlines()
    # Only the comment lines before the header: a quoted field (verify's generated text) may hold
    # a line that starts with '#' too.
    lead = 0
    while lead < len(lines) and lines[lead].startswith("#"):
        lead += 1
    comments, lines = lines[:lead], lines[lead:]
    if not lines:
        raise InputError(f"{path}: empty; expected {EXPECTED}")
    header = next(csv.reader([lines[0]]))
    return "".join(lines), header, comments


def schema_of(path, kind, comments=(), config=None):
    """The file's schema number (1 when it names none), refused when newer than this reader knows."""
    n = 1
    if config is None:
        for line in comments:
            if line.startswith("# config: "):
                try:
                    config = json.loads(line[len("# config: "):])
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}: its '# config:' line is not JSON ({e.msg})") from None
            m = re.match(r"# kvsim [a-z -]+ \(schema (\d+)\)", line)
            if m:
                n = int(m.group(1))
    if isinstance(config, dict) and isinstance(config.get("schema"), int):
        n = config["schema"]
    newest = SCHEMAS.get(kind, 1)
    if n > newest:
        raise InputError(f"{path}: a kvsim {kind} file of schema {n}, but this reader knows schema 1 to {newest} "
                         "(written by a newer kvsim; update kvsim)")
    return n


def csv_kind(path, header):
    cols = set(header)
    for kind, (identify, _) in CSV_KINDS.items():
        if identify <= cols:
            return kind
    raise InputError(f"{path}: a CSV with columns {', '.join(header[:8])}{', ...' if len(header) > 8 else ''}; "
                     f"expected {EXPECTED}")


def read_csv(path, kind=None):
    text, header, comments = _csv_text(path)
    kind = kind or csv_kind(path, header)
    schema = schema_of(path, kind, comments)
    missing = [c for c in CSV_KINDS[kind][1] if c not in header]
    if missing:
        raise InputError(f"{path}: no column {', '.join(repr(c) for c in missing)}; expected a kvsim {kind.replace('_', ' ')} "
                         f"file with columns {', '.join(CSV_KINDS[kind][1])}")
    df = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=["", "nan", "NaN", "-nan", "inf", "-inf"])
    for col in ("params", "policy", "request", "mode", "eviction", "kv_policy"):  # text, never NaN
        if col in df.columns:
            df[col] = df[col].fillna("").astype(str)
    df.attrs["path"] = path
    df.attrs["schema"] = schema
    return kind, df


def read_records(path, kind=None):
    """A result CSV's rows as dicts of strings (what the experiments' table scripts use), after the
    same kind, column and schema checks as read_csv."""
    text, header, comments = _csv_text(path)
    kind = kind or csv_kind(path, header)
    schema_of(path, kind, comments)
    missing = [c for c in CSV_KINDS[kind][1] if c not in header]
    if missing:
        raise InputError(f"{path}: no column {', '.join(repr(c) for c in missing)}; expected a kvsim "
                         f"{kind.replace('_', ' ')} file")
    return list(csv.DictReader(io.StringIO(text)))


def read_detail(path):
    rows, mode = [], ""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{n}: not JSON ({e.msg}); expected a kvsim sweep --detail JSONL") from None
            if n == 1 and "configs" in row:
                mode = row.get("mode", "")  # the sweep's configuration line
                schema_of(path, "detail", config=row)
                continue
            for key in ("request", "policy", "budget", "layer_kl"):
                if key not in row:
                    raise InputError(f"{path}:{n}: no field '{key}'; expected a kvsim sweep --detail row")
            rows.append(row)
    if not rows:
        raise InputError(f"{path}: no detail rows; expected a kvsim sweep --detail JSONL")
    df = pd.DataFrame(rows)
    df.attrs["path"] = path
    df.attrs["mode"] = mode
    return df


def read_json(path):
    try:
        with open(path) as f:
            j = json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg}); expected {EXPECTED}") from None
    if isinstance(j, dict) and "results" in j and j["results"]:
        first = j["results"][0]
        kind = "serve_sim" if "ttft_p50_ms" in first else "serve_hits" if "capacity_blocks" in first else None
        if kind:
            schema_of(path, kind, config=j)
            df = pd.DataFrame(j["results"])
            for key, value in j.items():
                if key != "results" and key not in df.columns and not isinstance(value, (list, dict)):
                    df[key] = value
            needed = [c for c in CSV_KINDS[kind][1] if c not in df.columns]
            if needed:
                raise InputError(f"{path}: results have no field {', '.join(needed)}; expected a kvsim serve summary")
            df.attrs["path"] = path
            return kind, df
    if isinstance(j, dict) and {"configs", "request", "compression_point"} <= set(j):
        schema_of(path, "keep_sets", config=j)
        for c in j["configs"]:
            if "kept" not in c or "label" not in c:
                raise InputError(f"{path}: a config without 'kept' or 'label'; expected kvsim trace keep-sets output")
        j["path"] = path
        return "keep_sets", j
    raise InputError(f"{path}: JSON of no known kind; expected a kvsim serve summary or kvsim trace keep-sets output")


def read_h5(path):
    import h5py  # only traces and model files need it
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise InputError(f"{path}: not readable as HDF5 ({e}); expected a kvtrace or learned-model file") from None
    with f:
        fmt = f.attrs.get("format", b"")
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt == "kvtrace":
            return "trace", path
        if "curve" in f:
            c = f["curve"]
            metric = c.attrs.get("metric", b"")
            method = f.attrs.get("method", b"")
            return "model", {"path": path, "metric": metric.decode() if isinstance(metric, bytes) else str(metric),
                             "method": method.decode() if isinstance(method, bytes) else str(method),
                             "step": c["step"][()], "value": c["value"][()]}
    raise InputError(f"{path}: HDF5 without format 'kvtrace' or a /curve group; expected a kvtrace or learned-model file")


def read_inputs(paths):
    """Reads every path into one Inputs, by kind."""
    out = Inputs()
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such file")
        ext = os.path.splitext(path)[1].lower()
        if ext == ".csv":
            kind, df = read_csv(path)
            (out.agreement.append((path, df)) if kind == "agreement" else getattr(out, kind).append(df))
        elif ext == ".jsonl":
            out.detail.append(read_detail(path))
        elif ext == ".json":
            kind, obj = read_json(path)
            getattr(out, kind).append(obj)
        elif ext in (".h5", ".hdf5"):
            kind, obj = read_h5(path)
            (out.traces if kind == "trace" else out.models).append(obj)
        else:
            raise InputError(f"{path}: unknown file kind '{ext or 'no extension'}'; expected {EXPECTED}")
    if not out.kinds():
        raise InputError(f"no inputs; expected {EXPECTED}")
    return out


def config_means(df, value_columns):
    """Per (mode, policy, params, budget): the byte ratio (compressed / full) and the means of
    `value_columns` over requests."""
    d = df.copy()
    d["bytes_ratio"] = d["compressed_bytes"] / (d["budget_bytes"] / d["budget"])
    if "mode" not in d.columns:
        d["mode"] = "query-aware"
    cols = ["bytes_ratio"] + [c for c in value_columns if c in d.columns]
    return d.groupby(["mode", "policy", "params", "budget"], as_index=False)[cols].mean(numeric_only=True)
