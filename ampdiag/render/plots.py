"""Figures for the reports, drawn with matplotlib (Agg, no display) and embedded as data URIs.

matplotlib is imported here only, and only when a figure is drawn.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec

P = ParamSpec("P")
MEMO_SIZE = 64


def memoized(draw: Callable[P, bytes]) -> Callable[P, bytes]:
    """Caches a figure's PNG by the arguments it was drawn from.

    The HTML report and TensorBoard embed the same figures; drawing is the slowest part of a
    render (about 0.1-0.3 s a figure), so each is drawn once.
    """
    cache: dict[str, bytes] = {}

    @functools.wraps(draw)
    def cached(*args: P.args, **kwargs: P.kwargs) -> bytes:
        key = repr((args, sorted(kwargs.items())))
        png = cache.get(key)
        if png is None:
            if len(cache) >= MEMO_SIZE:
                cache.clear()
            png = cache[key] = draw(*args, **kwargs)
        return png

    return cached


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig: Any) -> bytes:
    """PNG bytes of a figure (and closes it)."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    """A ``data:image/png;base64,...`` URI (the report's CSP allows data: images only)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@memoized
def stacked_bar(
    labels: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str, title: str
) -> bytes:
    """A stacked bar chart: one bar per label, one stack segment per series."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    bottom = [0.0] * len(labels)
    for name, values in series.items():
        ax.bar(list(labels), list(values), bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return figure_png(fig)


@memoized
def line(
    x: Sequence[float],
    ys: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    title: str,
    marks: Sequence[float] = (),
    logy: bool = False,
) -> bytes:
    """A line chart with optional vertical marks (e.g. skipped steps)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    for name, values in ys.items():
        ax.plot(list(x), list(values), marker="o", markersize=3, label=name)
    for m in marks:
        ax.axvline(m, color="tab:red", alpha=0.4, linestyle="--")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    if len(ys) > 1:
        ax.legend(fontsize=8)
    return figure_png(fig)


@memoized
def hbar(labels: Sequence[str], values: Sequence[float], xlabel: str, title: str) -> bytes:
    """A horizontal bar chart, first label on top."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(3, len(labels)) + 0.8))
    ax.barh(list(reversed(labels)), list(reversed(values)))
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return figure_png(fig)
