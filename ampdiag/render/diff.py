"""A before/after diff as text (console) and as one self-contained HTML page.

The page links both runs' reports, puts each figure side by side with its change and whether
that is better or worse (by the figure's own direction: a shorter step is better, more steps
per second are better, a share of op time has no direction), and charts both runs' step time
and loss per step (the report's SVG charts: hover values, no network).
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

from markupsafe import Markup

from ampdiag import units
from ampdiag.analysis.diff import MetricChange, SessionDiff
from ampdiag.render import charts, svg
from ampdiag.render.sections.time import outlier_ceiling
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
    if unit == "per_s":
        return f"{units.scalar(value)} steps/s" if value is not None else units.NOT_MEASURED
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


#: The page's charts: curve name -> (value axis label, title).
CURVES = {
    "step_time_ms": ("ms", "Wall time per step"),
    "loss": ("loss", "Loss per step"),
}


def figures(d: SessionDiff) -> dict[str, charts.Chart]:
    """Both runs' per-step curves, over the steps both ran (the page's charts, by name)."""
    out: dict[str, charts.Chart] = {}
    for name, (ylabel, title) in CURVES.items():
        before, after = (dict(c) for c in d.curves.get(name, ([], [])))
        steps = sorted(set(before) & set(after))
        if len(steps) < 2:
            continue
        names = (d.before_label, d.after_label)
        if names[0] == names[1]:
            names = (f"A: {names[0]}", f"B: {names[1]}")
        ys = {names[0]: [before[i] for i in steps], names[1]: [after[i] for i in steps]}
        ymax: float | None = None
        note = ""
        if name == "step_time_ms":
            ymax, above = outlier_ceiling([v for series in ys.values() for v in series])
            if above:
                note = "steps above the scale are drawn at its top"
        out[name] = charts.line(
            steps, ys, "step", ylabel, title, ymax=ymax, yzero=name != "loss", note=note
        )
    return out


def _link(folder: str | None, out: Path | None) -> str:
    """A link to a run's report.html: relative to the diff page's folder where it has one."""
    if folder is None:
        return "not saved"
    target = Path(folder) / "report.html"
    href = os.path.relpath(target, out) if out is not None else str(target)
    href = href.replace(os.sep, "/")
    return f"<a href='{html.escape(href)}'><code>{html.escape(href)}</code></a>"


def diff_html(d: SessionDiff, out: Path | None = None) -> str:
    """The HTML form: one document, inline CSS, no network (the report's CSS and policy).

    ``out``: the folder the page is written to, so that the links to both reports are
    relative to it.
    """
    e = html.escape
    body = [f"<h1>ampdiag diff: {e(d.before_label)} &rarr; {e(d.after_label)}</h1>"]
    body.append(
        "<p>Reports: A (before) "
        f"{_link(d.folders[0], out)}; B (after) {_link(d.folders[1], out)}. Better or worse "
        "follows each figure's direction (a shorter step, more steps per second, less memory, "
        "less underflow are better); a timing change within twice the runs' spread is "
        "&ldquo;same&rdquo;.</p>"
    )
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
            f"<td>{e(format_change(m))}</td><td class='verdict-{e(m.verdict.replace(' ', '-'))}'>"
            f"{e(m.verdict)}</td></tr>"
        )
    body.append("</tbody></table>")
    for name, chart in figures(d).items():
        body.append(f'<figure class="figure" aria-label="{e(name)}">{svg.inline(chart)}</figure>')
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
    target.write_text(diff_html(d, out), encoding="utf-8")
    return target
