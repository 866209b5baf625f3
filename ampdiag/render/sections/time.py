"""Where the step time goes.

The host breakdown per step, step wall times, the top ops, and the speed probe (the same step
in FP32 and under autocast).
"""

from __future__ import annotations

from typing import Any

from ampdiag import units as humanize
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "Step time"
NEEDS = "a profiled step (run at least skip + warm-up + 1 steps)"

#: At most this many per-step rows in the breakdown table (the chart shows every step).
TABLE_STEPS = 50


def categories(breakdown: dict[str, Any]) -> list[str]:
    """The breakdown's categories in the order the trace analysis wrote them."""
    return [str(c) for c in breakdown.get("share") or {}]


def figures(session: Session) -> dict[str, charts.Chart]:
    """The section's charts, by name (shared by the HTML and TensorBoard)."""
    prof = session.section("profiler")
    probe = session.section("speed_probe")
    steps = [s for s in session.steps if isinstance(s.get("wall_s"), (int, float))]
    out: dict[str, charts.Chart] = {}
    breakdown = prof.get("breakdown", {})
    rows = breakdown.get("steps", [])
    if rows:
        series = {
            c: [float(r.get(f"{c}_us") or 0.0) / 1000 for r in rows] for c in categories(breakdown)
        }
        out["step-breakdown"] = charts.bars(
            [f"step {r['step']}" for r in rows],
            series,
            "ms",
            "Host time per profiled step",
            unit="steps",
        )
    if len(steps) >= 2:
        out["step-times"] = charts.line(
            [s["index"] for s in steps],
            {"wall time": [s["wall_s"] * 1000 for s in steps]},
            "step",
            "ms",
            "Wall time per step",
        )
    if isinstance(probe.get("fp32_ms"), (int, float)):
        out["speed-probe"] = charts.bars(
            ["FP32", str(probe.get("autocast") or "autocast")],
            {"ms": [float(probe["fp32_ms"]), float(probe.get("autocast_ms") or 0.0)]},
            "ms per forward + backward (median of the samples)",
            "Speed probe: the same step in FP32 and under autocast",
            horizontal=True,
        )
    return out


def build(session: Session) -> ReportSection | None:
    """The time section, when there are steps, a profile or a speed probe."""
    prof = session.section("profiler")
    probe = session.section("speed_probe")
    steps = session.steps
    if not prof and not steps and not probe.get("fp32_ms"):
        return None
    uris = {name: svg.data_uri(chart) for name, chart in figures(session).items()}
    breakdown = prof.get("breakdown", {})
    rows = breakdown.get("steps", [])
    top_ops = prof.get("top_ops") or []
    html = render_template(
        "time.html.j2",
        prof=prof,
        probe=probe,
        steps=steps,
        figures=uris,
        categories=categories(breakdown),
        rows=rows[:TABLE_STEPS],
        more_rows=max(0, len(rows) - TABLE_STEPS),
        device_column=any(float(op.get("self_device_us") or 0.0) > 0 for op in top_ops),
    )
    share = breakdown.get("share", {})
    summary = ", ".join(f"{c} {humanize.percent(share[c])}" for c in categories(breakdown))
    return ReportSection(id="time", title=TITLE, html=html, summary=summary, figures=list(uris))
