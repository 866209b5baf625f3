"""Charts drawn as SVG text, for the HTML report.

Plain string formatting: no plotting library, so the report of a trace costs milliseconds per
figure instead of a second of matplotlib import and rasterising. The SVG is inlined in the page
(`inline`), so that it answers the reader: every point and bar carries its value as a
``<title>`` (the browser's own hover tooltip, no script), and a line chart carries its x data
(``data-x`` attributes) so that the report's one small script can zoom it (report.js). All text
is XML-escaped, so any name renders.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

from markupsafe import Markup, escape

from ampdiag.render.charts import Chart

WIDTH = 720
HEIGHT = 300
FONT = 11
CHAR_W = 0.6 * FONT  # a rough average glyph width, for layout only
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
MAX_TICK_LABELS = 12


def _t(text: str) -> str:
    return str(escape(text))


def _num(v: float) -> str:
    """A tick label: never in scientific notation (2^-22, 10^-6, 0.0025, 3M)."""
    v = float(v)
    if v == 0:
        return "0"
    a = abs(v)
    sign = "-" if v < 0 else ""
    if a < 1e-3:
        mantissa, exponent = math.frexp(a)
        if mantissa == 0.5:
            return f"{sign}2^{exponent - 1}"
        ten = math.log10(a)
        if abs(ten - round(ten)) < 1e-9:
            return f"{sign}10^{round(ten)}"
        return f"{v:.{2 - math.floor(ten)}f}".rstrip("0")
    if a >= 1e6:
        for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
            if a >= div:
                return f"{v / div:.3g}{suffix}"
    if v.is_integer() or a >= 1e4:
        return f"{round(v):,}"
    return f"{v:.4g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks: list[float] = []
    v = first
    while v <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 12))
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if b - a >= 2:
        step = max(1, (b - a) // 8)
        return [10.0**e for e in range(a, b + 1, step)]
    a2, b2 = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    step = max(1, (b2 - a2) // 8)
    return [2.0**e for e in range(a2, max(b2, a2 + 1) + 1, step)]


class _Canvas:
    """The plot area's geometry and the SVG elements drawn so far."""

    def __init__(self, chart: Chart, left: float, height: int) -> None:
        self.chart = chart
        names = [n for n, _ in chart.series]
        self.legend = len(names) > 1 or bool(chart.limits)
        legend_w = min(180, 24 + CHAR_W * max((len(n) for n in names), default=0))
        self.x0 = left
        self.x1 = WIDTH - (legend_w + 12 if len(names) > 1 else 16)
        self.y0 = 30 + (14 if chart.note else 0)
        self.y1 = height - 40
        self.height = height
        self.parts: list[str] = []

    def color(self, i: int) -> str:
        colors = self.chart.colors
        return colors[i] if i < len(colors) else PALETTE[i % len(PALETTE)]

    def text(self, x: float, y: float, s: str, anchor: str = "middle", **extra: str) -> None:
        attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in extra.items())
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{attrs}>{_t(s)}</text>'
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str, **extra: str) -> None:
        attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in extra.items())
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{stroke}"{attrs}/>'
        )

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: str = "") -> None:
        if w > 0 and h > 0:
            shape = f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{fill}"'
            self.parts.append(
                f"{shape}><title>{_t(title)}</title></rect>" if title else shape + "/>"
            )

    def frame(self) -> None:
        c = self.chart
        self.text(WIDTH / 2, 18, c.title, font_weight="bold", font_size=str(FONT + 2))
        if c.note:
            self.text(WIDTH / 2, 34, c.note, fill="#555")
        self.parts.append(
            f'<rect x="{self.x0:.1f}" y="{self.y0:.1f}" width="{self.x1 - self.x0:.1f}" '
            f'height="{self.y1 - self.y0:.1f}" fill="none" stroke="#333"/>'
        )
        if c.xlabel:
            self.text((self.x0 + self.x1) / 2, self.height - 6, c.xlabel)
        if c.ylabel:
            y = (self.y0 + self.y1) / 2
            self.text(14, y, c.ylabel, transform=f"rotate(-90 14 {y:.1f})")

    def legend_box(self) -> None:
        names = [n for n, _ in self.chart.series]
        if len(names) < 2:
            return
        x = self.x1 + 10
        for i, name in enumerate(names):
            y = self.y0 + 4 + i * 16
            self.rect(x, y, 10, 10, self.color(i))
            self.text(x + 14, y + 9, name, anchor="start")

    def svg(self, attrs: str = "") -> str:
        body = "".join(self.parts)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-{self.chart.kind}" '
            f'width="{WIDTH}" height="{self.height}" viewBox="0 0 {WIDTH} {self.height}" '
            f'font-family="sans-serif" font-size="{FONT}"{attrs}>'
            f'<rect width="100%" height="100%" fill="#fff"/>{body}</svg>'
        )

    def clip(self) -> str:
        """Opens a group clipped to the plot area (closed by the caller with ``</g>``)."""
        key = f"{zlib.crc32(repr(self.chart).encode('utf-8', 'replace')):08x}"
        self.parts.append(
            f'<defs><clipPath id="clip-{key}"><rect x="{self.x0:.1f}" y="{self.y0:.1f}" '
            f'width="{self.x1 - self.x0:.1f}" height="{self.y1 - self.y0:.1f}"/></clipPath>'
            f'</defs><g class="plot" clip-path="url(#clip-{key})">'
        )
        return key


class _Scale:
    """Maps values to pixels along one axis (linear or log10)."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool = False) -> None:
        self.log = log
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        self.lo, self.hi = lo, (hi if hi > lo else lo + 1.0)
        self.p0, self.p1 = p0, p1

    def __call__(self, v: float) -> float:
        if self.log:
            v = math.log10(v) if v > 0 else self.lo
        return self.p0 + (v - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)


def _value_axis(
    canvas: _Canvas, lo: float, hi: float, vertical: bool, log: bool = False, zero: bool = True
) -> _Scale:
    """Draws the value axis' ticks and grid; returns its scale."""
    if not zero and not log:
        pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
        ticks = nice_ticks(lo - pad, hi + pad)
        lo, hi = ticks[0], ticks[-1]
    elif log:
        positive = max(lo, 1e-300)
        ticks = _log_ticks(positive, max(hi, positive * 2))
        lo, hi = min(ticks[0], positive), max(ticks[-1], hi)
    else:
        ticks = nice_ticks(min(lo, 0.0), hi)
        lo, hi = ticks[0], ticks[-1]
    c = canvas
    if vertical:
        scale = _Scale(lo, hi, c.y1, c.y0, log)
        for t in ticks:
            y = scale(t)
            c.line(c.x0, y, c.x1, y, "#ddd")
            c.text(c.x0 - 4, y + 4, _num(t), anchor="end")
    else:
        scale = _Scale(lo, hi, c.x0, c.x1, log)
        for t in ticks:
            x = scale(t)
            c.line(x, c.y0, x, c.y1, "#ddd")
            c.text(x, c.y1 + 14, _num(t))
    return scale


def _every(n: int) -> int:
    return max(1, math.ceil(n / MAX_TICK_LABELS))


def _bars(chart: Chart) -> str:
    """Stacked bars: upright (``bars``, labels below) or lying (``hbars``, labels on the left)."""
    n = max(1, len(chart.labels))
    lying = chart.kind == "hbars"
    height = int(60 + max(3, n) * 20 + 20) if lying else HEIGHT
    left = min(340, 16 + CHAR_W * max((len(s) for s in chart.labels), default=4)) if lying else 64
    c = _Canvas(chart, left, height)
    c.frame()
    totals = [sum(v[i] for _, v in chart.series) for i in range(len(chart.labels))]
    scale = _value_axis(c, 0.0, max(totals, default=1.0) or 1.0, vertical=not lying)
    slot = ((c.y1 - c.y0) if lying else (c.x1 - c.x0)) / n
    bar = slot * 0.7 if lying else min(slot * 0.8, 80.0)
    unit = chart.xlabel if lying else chart.ylabel
    for i, label in enumerate(chart.labels):
        start = 0.0
        at = c.y0 + i * slot + slot * 0.15 if lying else c.x0 + (i + 0.5) * slot - bar / 2
        for k, (name, values) in enumerate(chart.series):
            end = start + values[i]
            tip = f"{label} — {name}: {_num(values[i])} {unit}".rstrip()
            if lying:
                c.rect(scale(start), at, scale(end) - scale(start), bar, c.color(k), tip)
            else:
                c.rect(at, scale(end), bar, scale(start) - scale(end), c.color(k), tip)
            start = end
        if lying:
            shown = label if len(label) <= 55 else label[:54] + "…"
            c.text(c.x0 - 4, c.y0 + (i + 0.5) * slot + 4, shown, anchor="end")
        elif i % _every(n) == 0:
            c.text(c.x0 + (i + 0.5) * slot, c.y1 + 14, label[:24])
    c.legend_box()
    return c.svg()


def _x_scale(c: _Canvas, xs: Sequence[float]) -> _Scale:
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    ticks = nice_ticks(lo, hi if hi > lo else lo + 1)
    integer = all(float(x).is_integer() for x in xs)
    if integer:
        ticks = [t for t in ticks if float(t).is_integer()] or ticks
    scale = _Scale(min(lo, ticks[0]), max(hi, ticks[-1]), c.x0, c.x1)
    for t in ticks:
        x = scale(t)
        c.line(x, c.y0, x, c.y1, "#eee")
        c.text(x, c.y1 + 14, _num(t), **{"class": "xtick", "data-px": f"{x:.1f}"})
    return scale


def _line(chart: Chart) -> str:
    c = _Canvas(chart, 64, HEIGHT)
    c.frame()
    values = [v for _, vs in chart.series for v in vs]
    xs = chart.x
    sx = _x_scale(c, xs)
    if chart.kind == "area":
        tops = [sum(vs[i] for _, vs in chart.series) for i in range(len(xs))]
        sy = _value_axis(c, 0.0, max(tops, default=1.0) or 1.0, vertical=True)
        base = [0.0] * len(xs)
        for k, (_, vs) in enumerate(chart.series):
            top = [b + v for b, v in zip(base, vs, strict=True)]
            upper = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, top, strict=True))
            lower = " ".join(
                f"{sx(x):.1f},{sy(y):.1f}" for x, y in reversed(list(zip(xs, base, strict=True)))
            )
            c.parts.append(
                f'<polygon points="{upper} {lower}" fill="{c.color(k)}" opacity="0.85"/>'
            )
            base = top
    else:
        positive = [v for v in values if v > 0]
        log = chart.logy and bool(positive)
        lo = min(positive) if log else min(values, default=0.0)
        hi = max(values, default=1.0) or 1.0
        if chart.ymax is not None and chart.ymax < hi:
            hi = chart.ymax
        sy = _value_axis(c, lo, hi, vertical=True, log=log, zero=chart.yzero)
        ceiling = sy.hi if not log else 10**sy.hi
        c.clip()
        for x0, x1, label in chart.bands:
            left, right = sx(x0 - 0.5), sx(x1 + 0.5)
            c.parts.append(
                f'<rect x="{left:.2f}" y="{c.y0:.2f}" width="{right - left:.2f}" '
                f'height="{c.y1 - c.y0:.2f}" fill="#1f77b41f" data-x0="{x0 - 0.5:g}" '
                f'data-x1="{x1 + 0.5:g}"><title>{_t(label)}</title></rect>'
            )
            c.text(
                (left + right) / 2,
                c.y0 + 12,
                label,
                fill="#1f5f94",
                **{"data-x": f"{(x0 + x1) / 2:g}"},
            )
        for m in chart.marks:
            c.line(
                sx(m),
                c.y0,
                sx(m),
                c.y1,
                "#d62728",
                stroke_dasharray="4 3",
                opacity="0.5",
                **{"data-x": f"{m:g}"},
            )
        xdata = " ".join(f"{x:g}" for x in xs)
        for k, (name, raw) in enumerate(chart.series):
            vs = tuple(min(v, ceiling) for v in raw)
            points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, vs, strict=True))
            c.parts.append(
                f'<polyline points="{points}" fill="none" stroke="{c.color(k)}" '
                f'stroke-width="1.5" vector-effect="non-scaling-stroke" data-xs="{xdata}"/>'
            )
            # a circle per point, in the order of data-xs, carries its value for the hover
            # tooltip (visible when there are few)
            seen = 'r="2.5"' if len(xs) <= 60 else 'r="4" fill-opacity="0"'
            who = f"{name} — " if len(chart.series) > 1 else ""
            c.parts.append(f'<g class="points" fill="{c.color(k)}">')
            for x, y, v in zip(xs, vs, raw, strict=True):
                tip = f"{who}{chart.xlabel} {_num(x)}: {_num(v)} {chart.ylabel}".strip()
                c.parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" {seen}><title>{_t(tip)}</title>'
                    "</circle>"
                )
            c.parts.append("</g>")
        c.parts.append("</g>")
    c.legend_box()
    attrs = (
        f' data-p0="{sx.p0:.1f}" data-p1="{sx.p1:.1f}" data-lo="{sx.lo:g}" data-hi="{sx.hi:g}"'
        if chart.kind == "line"
        else ""
    )
    return c.svg(attrs)


def _histogram(chart: Chart) -> str:
    c = _Canvas(chart, 64, HEIGHT)
    c.frame()
    xs = list(chart.x)
    limits = [x for x, _ in chart.limits]
    lo = min([*xs, *limits], default=0.0) - 1
    hi = max([*xs, *limits], default=1.0) + 2
    sx = _x_scale(c, [lo, hi])
    values = [v for _, vs in chart.series for v in vs]
    sy = _value_axis(c, 0.0, max(values, default=1.0) or 1.0, vertical=True)
    width = (sx(1.0) - sx(0.0)) * 0.8 / max(1, len(chart.series))
    for k, (_, vs) in enumerate(chart.series):
        for x, v in zip(xs, vs, strict=True):
            left = sx(x) + k * width
            c.rect(left, sy(v), width, sy(0.0) - sy(v), c.color(k))
    for x, label in chart.limits:
        px = sx(x)
        c.line(px, c.y0, px, c.y1, "#d62728", stroke_dasharray="4 3")
        c.text(
            px - 3,
            c.y0 + 6,
            label,
            anchor="end",
            transform=f"rotate(-90 {px - 3:.1f} {c.y0 + 6:.1f})",
        )
    c.legend_box()
    return c.svg()


_DRAW = {"bars": _bars, "hbars": _bars, "line": _line, "area": _line, "histogram": _histogram}


def draw(chart: Chart) -> str:
    """The chart as an SVG document."""
    return _DRAW[chart.kind](chart)


def inline(chart: Chart) -> Markup:
    """The chart as SVG markup to place in the page (lone surrogates replaced)."""
    text = draw(chart).encode("utf-8", errors="replace").decode("utf-8")
    text = text.replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)  # HTML knows <svg>
    return Markup(text)  # every text in it was escaped by _t
