"""Charts drawn as PNG with matplotlib, for TensorBoard's image dashboard.

matplotlib is imported here only, when a figure is drawn, and only through its object-oriented
API (``Figure`` + ``FigureCanvasAgg``): no ``matplotlib.use()``, no pyplot, no rcParams change,
so the user's backend and settings are left as found. Text is passed with ``$`` escaped, so a
name that looks like mathtext is drawn as written instead of failing the figure.
"""

from __future__ import annotations

import functools
import io
from typing import Any

from ampdiag.render.charts import Chart

DPI = 110
MEMO_SIZE = 32


def _plain(text: str) -> str:
    """Text matplotlib draws literally: ``$`` escaped (no mathtext), lone surrogates replaced."""
    text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text.replace("$", r"\$")


def _figure(width: float, height: float) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _draw(chart: Chart) -> bytes:
    names = [_plain(n) for n, _ in chart.series]
    colors = list(chart.colors) + [None] * len(names)
    if chart.kind == "hbars":
        fig, ax = _figure(7, 0.32 * max(3, len(chart.labels)) + 1.0)
        labels = [_plain(s) for s in reversed(chart.labels)]
        left = [0.0] * len(labels)
        for (name, values), color in zip(
            zip(names, [v for _, v in chart.series], strict=True), colors, strict=False
        ):
            vals = list(reversed(values))
            ax.barh(labels, vals, left=left, label=name, color=color)
            left = [a + b for a, b in zip(left, vals, strict=True)]
    else:
        fig, ax = _figure(7, 3)
        if chart.kind == "bars":
            labels = [_plain(s) for s in chart.labels]
            bottom = [0.0] * len(labels)
            for (name, values), color in zip(
                zip(names, [v for _, v in chart.series], strict=True), colors, strict=False
            ):
                ax.bar(labels, list(values), bottom=bottom, label=name, color=color)
                bottom = [a + b for a, b in zip(bottom, values, strict=True)]
        elif chart.kind == "area":
            ax.stackplot(list(chart.x), *[list(v) for _, v in chart.series], labels=names)
        elif chart.kind == "histogram":
            width = 0.8 / max(1, len(names))
            for i, (name, (_, values)) in enumerate(zip(names, chart.series, strict=True)):
                xs = [x + i * width for x in chart.x]
                ax.bar(xs, list(values), width=width, label=name, align="edge")
            for x, label in chart.limits:
                ax.axvline(x, color="tab:red", linestyle="--", alpha=0.7)
                ax.text(
                    x, ax.get_ylim()[1] * 0.95, _plain(label), rotation=90, va="top", fontsize=7
                )
        else:
            for name, (_, values) in zip(names, chart.series, strict=True):
                ax.plot(
                    list(chart.x),
                    list(values),
                    marker="o" if len(chart.x) <= 60 else None,
                    markersize=3,
                    label=name,
                )
            for m in chart.marks:
                ax.axvline(m, color="tab:red", alpha=0.4, linestyle="--")
            for x0, x1, label in chart.bands:
                ax.axvspan(x0 - 0.5, x1 + 0.5, color="tab:blue", alpha=0.12, label=label)
            if chart.logy and any(v > 0 for _, vs in chart.series for v in vs):
                ax.set_yscale("log")
            if chart.ymax is not None:
                ax.set_ylim(top=chart.ymax)
    ax.set_xlabel(_plain(chart.xlabel))
    ax.set_ylabel(_plain(chart.ylabel))
    ax.set_title(_plain(chart.title + (f"\n({chart.note})" if chart.note else "")), fontsize=10)
    if len(names) > 1 or chart.limits:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


@functools.lru_cache(maxsize=MEMO_SIZE)
def draw(chart: Chart) -> bytes:
    """The chart as PNG bytes (cached by its content: a Chart is frozen and hashable)."""
    return _draw(chart)
