"""Shared fixtures for the trace tests: real traces (trimmed copies in tests/data/traces), tiny
synthetic ones."""

from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ampdiag.trace.columns import GPU_KINDS, HOST_CATEGORIES

REPO = Path(__file__).resolve().parents[2]


FIXTURES = REPO / "tests" / "data" / "traces"
"""Real traces from ../shared/traces, the two large ones trimmed (see README.md there): in the
repository, so the reader and HTA-parity tests run on a fresh clone."""


@pytest.fixture(scope="session")
def traces() -> Path:
    return FIXTURES


def manifest(root: Path) -> list[dict[str, str]]:
    with open(root / "MANIFEST.tsv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def kernel(ts: float, dur: float, name: str, corr: int, stream: int = 7) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": corr, "device": 0},
    }


def launch(ts: float, corr: int, dur: float = 2.0) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 10,
        "tid": 10,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"ProfilerStep#{n}",
        "pid": 10,
        "tid": 10,
        "ts": ts,
        "dur": dur,
        "args": {},
    }


def write_trace(path: Path, events: list[Any], **top: Any) -> Path:
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    text = json.dumps(doc)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def gpu(rt: Any) -> list[tuple[float, float, int, int, str, str]]:
    """A RankTrace's GPU activities as (start_us, dur_us, stream, correlation, name, kind)."""
    c = rt.columns()
    cols = (c.gpu_ts, c.gpu_dur, c.gpu_stream, c.gpu_corr, c.gpu_name, c.gpu_kind)
    return [
        (t, d, s, k, c.names[n], GPU_KINDS[g])
        for t, d, s, k, n, g in zip(*(x.tolist() for x in cols), strict=True)
    ]


def launches(rt: Any) -> dict[int, tuple[float, float, str]]:
    """A RankTrace's launch calls: correlation -> (start_us, dur_us, name)."""
    c = rt.columns()
    cols = (c.launch_corr, c.launch_ts, c.launch_dur, c.launch_name)
    return {k: (t, d, c.names[n]) for k, t, d, n in zip(*(x.tolist() for x in cols), strict=True)}


def host(rt: Any) -> list[tuple[float, float, str, Any]]:
    """A RankTrace's host spans the step breakdown counts: (start_us, end_us, category, pid)."""
    c = rt.columns()
    cols = (c.host_start, c.host_end, c.host_cat, c.host_pid)
    return [
        (s, e, HOST_CATEGORIES[k], c.pids[p])
        for s, e, k, p in zip(*(x.tolist() for x in cols), strict=True)
    ]


def records(rt: Any) -> tuple[Any, ...]:
    """Everything a RankTrace holds, in a comparable form (host spans and launches sorted)."""
    return (
        sorted(gpu(rt)),
        sorted(launches(rt).items()),
        rt.steps,
        sorted(host(rt), key=repr),
        rt.events,
        rt.cpu_ops,
        rt.skipped,
        (rt.rank, rt.rank_source, rt.world_size, rt.devices),
    )


def no_children_left() -> None:
    """Asserts that this process has no child process, running or unreaped."""
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)
