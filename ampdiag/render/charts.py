"""Charts as data: what a figure shows, apart from how it is drawn.

A section describes each figure as a `Chart`; the HTML report draws it as inline SVG
(`ampdiag.render.svg`, plain string formatting, no plotting library: neither a report nor the
user's exit pays a second to import one; TensorBoard draws its own charts from the scalars).
Long series are aggregated here, before they are drawn, so a run of 100k steps gives a chart
of a few hundred points in bounded time and size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["bars", "hbars", "line", "area", "histogram"]

#: Most bars or points a chart shows; longer series are averaged over runs of neighbors.
MAX_POINTS = 300
#: Most category bars (ranks, steps) in a bar chart before neighbors are averaged.
MAX_BARS = 60


@dataclass(frozen=True)
class Chart:
    """One figure's content.

    Attributes:
        kind: bars (vertical, stacked), hbars (horizontal, stacked, first label on top), line,
            area (stacked), histogram (side-by-side bars per integer x).
        title, xlabel, ylabel: Text; any characters (drawers escape what their format needs).
        labels: Category names (bars, hbars).
        x: Positions (line, area, histogram).
        series: (name, values) pairs, one value per label or x.
        marks: Vertical dashed marks at these x (line: e.g. skipped steps).
        limits: (x, label) reference lines (histogram: FP16's range).
        logy: A logarithmic value axis (line).
        bands: (x0, x1, label) shaded ranges of x (line: e.g. the profiled steps).
        yzero: The value axis starts at zero (line; False: at the data, as a loss curve's).
        ymax: The top of the value axis (line): values above it are drawn at the top edge,
            so that one outlier (a first step that compiles and warms up) does not flatten
            the rest; the note says which points lie above.
        note: Says how the data was aggregated, when it was.
    """

    kind: Kind
    title: str
    xlabel: str = ""
    ylabel: str = ""
    labels: tuple[str, ...] = ()
    x: tuple[float, ...] = ()
    series: tuple[tuple[str, tuple[float, ...]], ...] = ()
    marks: tuple[float, ...] = ()
    limits: tuple[tuple[float, str], ...] = ()
    logy: bool = False
    bands: tuple[tuple[float, float, str], ...] = ()
    yzero: bool = True
    ymax: float | None = None
    note: str = ""
    colors: tuple[str, ...] = field(default=())


def _finite(v: float) -> float:
    return v if math.isfinite(v) else 0.0


def _runs(n: int, limit: int) -> list[tuple[int, int]]:
    """Splits range(n) into at most `limit` consecutive runs of nearly equal length."""
    if n <= limit:
        return [(i, i + 1) for i in range(n)]
    edges = [round(i * n / limit) for i in range(limit + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def bars(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
    *,
    unit: str = "",
    horizontal: bool = False,
    colors: Sequence[str] = (),
) -> Chart:
    """Stacked bars, one per label; beyond MAX_BARS, neighbors averaged into one bar."""
    runs = _runs(len(labels), MAX_BARS)
    note = ""
    if len(runs) < len(labels):
        names = [labels[a] if b - a == 1 else f"{labels[a]}…{labels[b - 1]}" for a, b in runs]
        data = {
            k: [_mean([_finite(float(x)) for x in v[a:b]]) for a, b in runs]
            for k, v in series.items()
        }
        note = f"{len(labels)} {unit or 'bars'}, neighbors averaged into {len(runs)} bars"
    else:
        names = list(labels)
        data = {k: [_finite(float(x)) for x in v] for k, v in series.items()}
    return Chart(
        kind="hbars" if horizontal else "bars",
        title=title,
        xlabel=ylabel if horizontal else "",
        ylabel="" if horizontal else ylabel,
        labels=tuple(str(n) for n in names),
        series=tuple((str(k), tuple(v)) for k, v in data.items()),
        note=note,
        colors=tuple(colors),
    )


def line(
    x: Sequence[float],
    ys: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    title: str,
    *,
    marks: Sequence[float] = (),
    logy: bool = False,
    kind: Kind = "line",
    bands: Sequence[tuple[float, float, str]] = (),
    ymax: float | None = None,
    yzero: bool = True,
    note: str = "",
) -> Chart:
    """A line (or stacked area) chart; beyond MAX_POINTS points, runs of neighbors averaged."""
    runs = _runs(len(x), MAX_POINTS)
    if len(runs) < len(x):
        xs = [_mean([float(v) for v in x[a:b]]) for a, b in runs]
        data = {
            k: [_mean([_finite(float(u)) for u in v[a:b]]) for a, b in runs] for k, v in ys.items()
        }
        averaged = f"{len(x)} points, neighbors averaged into {len(runs)}"
        note = f"{note}; {averaged}" if note else averaged
    else:
        xs = [float(v) for v in x]
        data = {k: [_finite(float(u)) for u in v] for k, v in ys.items()}
    shown_marks = sorted(set(float(m) for m in marks))
    if len(shown_marks) > MAX_POINTS:
        shown_marks = [shown_marks[a] for a, _ in _runs(len(shown_marks), MAX_POINTS)]
    return Chart(
        kind=kind,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        x=tuple(xs),
        series=tuple((str(k), tuple(v)) for k, v in data.items()),
        marks=tuple(shown_marks),
        logy=logy,
        bands=tuple((float(a), float(b), str(t)) for a, b, t in bands),
        ymax=ymax,
        yzero=yzero,
        note=note,
    )


def histogram(
    series: Mapping[str, Mapping[int, float]],
    xlabel: str,
    ylabel: str,
    title: str,
    *,
    limits: Sequence[tuple[float, str]] = (),
) -> Chart:
    """Counts per integer bin (e.g. log2 exponent), several series side by side."""
    xs = sorted({int(k) for h in series.values() for k in h})
    return Chart(
        kind="histogram",
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        x=tuple(float(v) for v in xs),
        series=tuple(
            (str(name), tuple(float(h.get(v, 0)) for v in xs)) for name, h in series.items()
        ),
        limits=tuple((float(a), str(b)) for a, b in limits),
    )
