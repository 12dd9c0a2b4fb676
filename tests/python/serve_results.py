"""A serving run's results as the checks compare them: the CSV rows and the JSON summary, without the
wall-clock `seconds` (the only column that differs between an uninterrupted, a resumed and an MPI run)."""
import csv
import json


def serve_rows(path):
    """`path` is the run's CSV; its JSON summary is beside it (same name, .json)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for r in rows:
        r.pop("seconds", None)
    with open(path[:-4] + ".json") as f:
        summary = json.load(f)
    for r in summary["results"]:
        r.pop("seconds", None)
    return rows, summary
