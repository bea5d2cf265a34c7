#!/usr/bin/env python3
"""Copies what scripts/calibrate.py needs from an AIConfigurator FPM golden run into the repo.

Stdlib only. Usage (from the repository root):

    python3 scripts/calibration_import.py SRC DEST

SRC is a run directory as AIConfigurator's collector writes it (`collect.log` and one
`tp<N>_ep1_*` folder per TP, each with `fpm_metrics_phase.csv` and `request_workload.csv`),
e.g. ../shared/calibration/aic-fpm-qwen3-32b-vllm. DEST gets, per TP, `tp<N>/passes.csv.gz`
(every measured forward pass: kind, workload segment, the five pass-shape columns, latency)
and `tp<N>/requests.csv` (the 128 "real" requests in the order they were sent, with the
end-to-end time `collect.log` reports for each; empty for a request that failed), plus the licence file if SRC has one.
Nothing is filtered, rounded or fitted; columns the calibration does not read are dropped.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import shutil
import sys
from pathlib import Path

PASS_COLUMNS = ["phase", "workload_segment", "ctx_tokens", "ctx_requests", "ctx_kv_tokens",
                "decode_requests", "decode_kv_tokens", "latency_ms"]
REQUEST_COLUMNS = ["request_index", "prompt_tokens", "max_tokens", "elapsed_seconds"]


def log_sections(log: Path) -> dict[int, dict[int, str]]:
    """elapsed_seconds (as written) per request index, per TP (the log runs the TPs in turn)."""
    sections: dict[int, dict[int, str]] = {}
    current = None
    for line in log.read_text().splitlines():
        m = re.search(r"--tp-size (\d+)", line)
        if m and "collect_fpm_metrics" in line:
            current = sections.setdefault(int(m.group(1)), {})
            continue
        m = re.match(r"request_ok index=(\d+) .*elapsed_seconds=([0-9.]+)", line)
        if m and current is not None:
            current[int(m.group(1))] = m.group(2)
    return sections


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dest = Path(argv[0]), Path(argv[1])
    elapsed = log_sections(src / "collect.log")
    for folder in sorted(src.glob("tp*_*")):
        tp = int(re.match(r"tp(\d+)", folder.name).group(1))
        out = dest / f"tp{tp}"
        out.mkdir(parents=True, exist_ok=True)
        # gzip without a timestamp: the same input gives the same bytes (7x smaller than CSV).
        with open(folder / "fpm_metrics_phase.csv", newline="") as f, \
                gzip.GzipFile(out / "passes.csv.gz", "wb", compresslevel=9, mtime=0) as raw, \
                io.TextIOWrapper(raw, newline="") as g:
            w = csv.writer(g, lineterminator="\n")
            w.writerow(PASS_COLUMNS)
            for row in csv.DictReader(f):
                w.writerow([row[c] for c in PASS_COLUMNS])
        with open(folder / "request_workload.csv", newline="") as f, \
                open(out / "requests.csv", "w", newline="") as g:
            w = csv.writer(g, lineterminator="\n")
            w.writerow(REQUEST_COLUMNS)
            for row in csv.DictReader(f):
                if row["workload_label"] != "real":
                    continue
                idx = int(row["request_index"])
                # A request that failed (no request_ok line) keeps an empty time.
                w.writerow([idx, row["prompt_tokens"], row["max_tokens"], elapsed[tp].get(idx, "")])
        print(f"tp{tp}: {out}")
    for lic in src.glob("LICENSE*"):
        shutil.copy(lic, dest / lic.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
