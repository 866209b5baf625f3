"""Where the step time goes.

The host breakdown per step, step wall times, the top ops, and the speed probe (the same step
in FP32 and under autocast).
"""

from __future__ import annotations

import statistics
from typing import Any

from ampdiag import units as humanize
from ampdiag.render import charts, stated, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "Step time"
NEEDS = "a profiled step (run at least skip + warm-up + 1 steps)"

#: At most this many per-step rows in the breakdown table (the chart shows every step).
TABLE_STEPS = 50


def categories(breakdown: dict[str, Any]) -> list[str]:
    """The breakdown's categories in the order the trace analysis wrote them."""
    return [str(c) for c in breakdown.get("share") or {}]


#: A step slower than this many times the median step lies above the step-time chart's scale.
OUTLIER_FACTOR = 10.0


def outlier_ceiling(values: list[float]) -> tuple[float | None, list[int]]:
    """The value axis' top, and the indices of the values above it ((None, []): none).

    It keeps outliers (a first step that compiles and warms up) from flattening the rest.
    """
    if len(values) < 3:
        return None, []
    median = statistics.median(values)
    limit = OUTLIER_FACTOR * median
    above = [i for i, v in enumerate(values) if v > limit]
    if not above or median <= 0:
        return None, []
    return 1.2 * max(v for v in values if v <= limit), above


def runs_of(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive integers grouped into (first, last) runs: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


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
        ms = [s["wall_s"] * 1000 for s in steps]
        profiled = [s["index"] for s in steps if s.get("profiled")]
        ymax, above = outlier_ceiling(ms)
        note = ", ".join(
            f"step {steps[i]['index']}: {humanize.micros(ms[i] * 1000)}" for i in above[:3]
        ) + (" (above the scale)" if above else "")
        out["step-times"] = charts.line(
            [s["index"] for s in steps],
            {"wall time": ms},
            "step",
            "ms",
            "Wall time per step (shaded: the steps the profiler recorded)",
            bands=[(a, b, "profiled") for a, b in runs_of(profiled)],
            ymax=ymax,
            note=note,
        )
    speed = stated.figures(session).get("speed_vs_fp32")
    if isinstance(speed, dict):
        by = "precision A/B" if speed.get("source") == "precision A/B" else "speed probe"
        out["speed-probe"] = charts.bars(
            [
                "FP32",
                str(probe.get("autocast") or session.environment.get("autocast") or "autocast"),
            ],
            {"ms": [float(speed["fp32_ms"]), float(speed["run_ms"])]},
            "ms per forward + backward (median of the samples)",
            f"The same step in FP32 and under autocast ({by})",
            horizontal=True,
        )
    return out


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The time section, when there are steps, a profile or a speed probe."""
    prof = session.section("profiler")
    probe = session.section("speed_probe")
    steps = session.steps
    if not prof and not steps and not probe.get("fp32_ms"):
        return None
    uris = {name: svg.inline(chart) for name, chart in figures(session).items()}
    breakdown = prof.get("breakdown", {})
    rows = breakdown.get("steps", [])
    top_ops = prof.get("top_ops") or []
    html = render_template(
        "time.html.j2",
        prof=prof,
        probe=probe,
        speed=stated.figures(session).get("speed_vs_fp32"),
        autocast=probe.get("autocast") or session.environment.get("autocast") or "autocast",
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
