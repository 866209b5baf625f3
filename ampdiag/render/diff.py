"""A before/after diff as text (console) and as one self-contained HTML page."""

from __future__ import annotations

import html
import math
from pathlib import Path

from markupsafe import Markup

from ampdiag import units
from ampdiag.analysis.diff import MetricChange, SessionDiff
from ampdiag.render.templating import page
from ampdiag.session import Finding

DIFF_FILE = "diff.html"


def format_value(value: float | None, unit: str) -> str:
    """A figure as a user reads it (MiB, ms, %, or "not measured"), as every report writes it."""
    if unit == "bytes":
        return units.nbytes(value)
    if unit == "s":
        return units.micros(value * 1e6 if value is not None else None)
    if unit == "fraction":
        return units.percent(value)
    if unit == "count":
        return units.count(round(value) if value is not None and math.isfinite(value) else value)
    return units.scalar(value)


def format_change(m: MetricChange) -> str:
    """The change from A to B: relative for sizes and times, in points for fractions."""
    if m.change is None or m.before is None:
        return ""
    if m.unit == "fraction":
        return f"{m.change * 100:+.1f} pts"
    if m.unit == "count":
        return f"{m.change:+.0f}"
    if m.before and not math.isnan(m.before) and not math.isnan(m.change):
        return f"{m.change / abs(m.before):+.0%}"
    return ""


def _finding_line(f: Finding) -> str:
    return f"{f.id} ({f.severity}): {f.title}"


def diff_text(d: SessionDiff) -> str:
    """The console form: one line per figure, then the findings by what happened to them."""
    rows = [(m.label, format_value(m.before, m.unit), format_value(m.after, m.unit),
             format_change(m), m.verdict) for m in d.metrics]  # fmt: skip
    head = ("", d.before_label, d.after_label, "change", "")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    lines = [f"ampdiag diff: {d.before_label} -> {d.after_label}"]
    for r in [head, *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for title, items in (("resolved", d.resolved), ("new", d.new), ("unchanged", d.unchanged)):
        lines.append(f"  findings {title} ({len(items)}):")
        lines.extend(f"    {_finding_line(f)}" for f in items)
    return "\n".join(lines)


def diff_html(d: SessionDiff) -> str:
    """The HTML form: one document, inline CSS, no network (the report's CSS and policy)."""
    e = html.escape
    body = [f"<h1>ampdiag diff: {e(d.before_label)} &rarr; {e(d.after_label)}</h1>"]
    body.append(
        "<table><thead><tr><th>figure</th>"
        f"<th>{e(d.before_label)}</th><th>{e(d.after_label)}</th>"
        "<th>change</th><th></th></tr></thead><tbody>"
    )
    for m in d.metrics:
        body.append(
            f"<tr class='{e(m.verdict.replace(' ', '-'))}'><td>{e(m.label)}</td>"
            f"<td>{e(format_value(m.before, m.unit))}</td>"
            f"<td>{e(format_value(m.after, m.unit))}</td>"
            f"<td>{e(format_change(m))}</td><td>{e(m.verdict)}</td></tr>"
        )
    body.append("</tbody></table>")
    for title, items in (("Resolved", d.resolved), ("New", d.new), ("Unchanged", d.unchanged)):
        body.append(f"<h2>{title} findings ({len(items)})</h2>")
        if items:
            body.append("<ul>")
            body.extend(
                f"<li><code>{e(f.id)}</code> <span class='sev-{e(f.severity)}'>"
                f"{e(f.severity)}</span> {e(f.title)}</li>"
                for f in items
            )
            body.append("</ul>")
        else:
            body.append("<p>none</p>")
    return page("ampdiag diff", Markup("".join(body)))  # every part escaped above


def write_diff_html(d: SessionDiff, out: Path) -> Path:
    """Writes out/diff.html and returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / DIFF_FILE
    target.write_text(diff_html(d), encoding="utf-8")
    return target
