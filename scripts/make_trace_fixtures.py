"""Makes tests/data/traces from the shared real traces (../shared/traces, or $AMPDIAG_TRACES).

Small traces are copied as they are; the two large ones are trimmed to a time window (every
event that starts before the second ``ProfilerStep`` has run ``KEEP_US`` into it, so two steps
remain and the window analysis is exercised), keeping their top-level keys. The result is a
few MB in all, so the reader and HTA-parity tests run on a fresh clone. Re-run after the shared
traces change; MANIFEST.tsv is rewritten with counts made by json.load.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "traces"
TRIM = {
    "df_index_resolver/df_index_resolver.json.gz": 2,  # the step whose start + KEEP_US is the end
    "nccl_parser_config/nccl_data.json.gz": 2,
}
KEEP_US = 20_000.0


def _trim(doc: dict, step_index: int) -> dict:
    events = doc["traceEvents"]
    steps = sorted(
        e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and "ts" in e
    )
    cutoff = steps[step_index] + KEEP_US
    kept = [e for e in events if e.get("ph") == "M" or e.get("ts", cutoff) < cutoff]
    return {**doc, "traceEvents": kept}


def _count(doc: dict) -> tuple[int, int]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return 0, 0
    kernels = sum(1 for e in events if isinstance(e, dict) and e.get("cat") in ("kernel", "Kernel"))
    return len(events), kernels


def main() -> None:
    src = Path(os.environ.get("AMPDIAG_TRACES", REPO.parent / "shared" / "traces"))
    if not (src / "MANIFEST.tsv").is_file():
        sys.exit(f"shared traces not found at {src}")
    with open(src / "MANIFEST.tsv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    for row in rows:
        dest = OUT / row["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if row["path"] in TRIM:
            doc = json.loads(gzip.decompress((src / row["path"]).read_bytes()))
            doc = _trim(doc, TRIM[row["path"]])
            text = json.dumps(doc).encode()
            dest.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
            row["json_bytes"] = str(len(text))
            events, kernels = _count(doc)
            row["events"], row["gpu_kernels"] = str(events), str(kernels)
            row["description"] = f"TRIMMED (scripts/make_trace_fixtures.py): {row['description']}"
        else:
            shutil.copyfile(src / row["path"], dest)
    with open(OUT / "MANIFEST.tsv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
