"""Host-side step-time breakdown of a Kineto trace: forward, backward, optimizer, data, other.

Each ``ProfilerStep#N`` span is cut into elementary intervals; each interval goes to the
highest-priority category of the events covering it (data loading > optimizer > backward >
forward), and what no event covers is "other" (Python between ops, the profiler's own work).
The categories come from names torch itself writes:

- data: ``enumerate(DataLoader)#...`` annotations,
- optimizer: ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` annotations,
- backward: ``autograd::engine::evaluate_function: ...`` ops (on any thread of the process),
- forward: every other CPU op inside the step.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

CATEGORIES = ("forward", "backward", "optimizer", "data", "other")
_PRIORITY = {"data": 4, "optimizer": 3, "backward": 2, "forward": 1}
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_HOST_CATS = {"cpu_op", "user_annotation", "operator", "python_function", "Operator"}


def load_trace_json(path: str | Path) -> dict[str, Any]:
    """Reads a Kineto trace file (.json or .json.gz) as a dict."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict):
        raise ValueError(f"{p} is not a Kineto trace (not a JSON object)")
    return doc


def classify(name: str, cat: str) -> str | None:
    """The breakdown category of one host event, or None for events that do not count."""
    if name.startswith("enumerate(DataLoader)"):
        return "data"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer"
    if name.startswith("autograd::engine::evaluate_function"):
        return "backward"
    if cat in ("cpu_op", "operator", "Operator"):
        return "forward"
    return None


def _covered_by_category(
    spans: list[tuple[float, float, str]], start: float, end: float
) -> dict[str, float]:
    """Length of [start, end] covered by each category, higher priority winning overlaps."""
    points: list[tuple[float, int, str]] = []
    for s, e, cat in spans:
        s, e = max(s, start), min(e, end)
        if e > s:
            points.append((s, 1, cat))
            points.append((e, -1, cat))
    points.sort(key=lambda p: (p[0], p[1]))
    active = dict.fromkeys(_PRIORITY, 0)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    last = start
    for t, delta, cat in points:
        if t > last:
            winner = max(
                (c for c, n in active.items() if n > 0), key=_PRIORITY.__getitem__, default="other"
            )
            totals[winner] += t - last
            last = t
        active[cat] += delta
    totals["other"] += max(0.0, end - last)
    return totals


def breakdown(
    events: list[dict[str, Any]], only_steps: Collection[int] | None = None
) -> dict[str, Any]:
    """Per-step and mean host time by category, in microseconds.

    Args:
        events: The trace's ``traceEvents``.
        only_steps: Keep these step numbers only (e.g. drop the stub step the profiler
            opens after the last ``step()`` when a run ends inside its active window).

    Returns:
        ``{"steps": [{"step", "total_us", "forward_us", ...}], "mean": {...},
        "share": {category: fraction of step time}}``; empty lists when no step was traced.
    """
    steps: list[tuple[int, float, float, Any]] = []
    host: list[tuple[float, float, str, Any]] = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        name = str(ev.get("name", ""))
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        match = _STEP_RE.match(name)
        if match:
            if only_steps is not None and int(match.group(1)) not in only_steps:
                continue
            steps.append((int(match.group(1)), ts, ts + dur, ev.get("pid")))
            continue
        cat = str(ev.get("cat", ""))
        if cat not in _HOST_CATS:
            continue
        category = classify(name, cat)
        if category is not None:
            host.append((ts, ts + dur, category, ev.get("pid")))
    rows = []
    for number, start, end, pid in sorted(steps):
        spans = [(s, e, c) for s, e, c, p in host if p == pid and e > start and s < end]
        totals = _covered_by_category(spans, start, end)
        row: dict[str, Any] = {"step": number, "total_us": end - start}
        row.update({f"{c}_us": totals[c] for c in CATEGORIES})
        rows.append(row)
    return summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step rows -> ``{"steps", "mean", "share"}`` (the shape every breakdown has)."""
    if not rows:
        return {"steps": [], "mean": {}, "share": {}}
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "step"}
    total = mean["total_us"] or 1.0
    share = {c: mean[f"{c}_us"] / total for c in CATEGORIES}
    return {"steps": rows, "mean": mean, "share": share}


def breakdown_from_trace_file(
    path: str | Path, only_steps: Collection[int] | None = None
) -> dict[str, Any]:
    """`breakdown` of the events in a trace file."""
    events = load_trace_json(path).get("traceEvents") or []
    return breakdown([e for e in events if isinstance(e, dict)], only_steps)
