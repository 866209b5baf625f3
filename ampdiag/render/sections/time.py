"""Where the step time goes: the host breakdown per step, step wall times, the top ops."""

from __future__ import annotations

from ampdiag.render import plots
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session
from ampdiag.trace.step_breakdown import CATEGORIES


def build(session: Session) -> ReportSection | None:
    """The time section, when there are steps or a profile."""
    prof = session.section("profiler")
    steps = session.steps
    if not prof and not steps:
        return None
    figures: dict[str, str] = {}
    rows = prof.get("breakdown", {}).get("steps", [])
    if rows:
        series = {c: [r[f"{c}_us"] / 1000 for r in rows] for c in CATEGORIES}
        figures["step-breakdown"] = plots.data_uri(
            plots.stacked_bar(
                [f"step {r['step']}" for r in rows], series, "ms", "Host time per profiled step"
            )
        )
    if len(steps) >= 2:
        figures["step-times"] = plots.data_uri(
            plots.line(
                [s["index"] for s in steps],
                {"wall time": [s["wall_s"] * 1000 for s in steps]},
                "step",
                "ms",
                "Wall time per step",
            )
        )
    html = render_template(
        "time.html.j2", prof=prof, steps=steps, figures=figures, categories=CATEGORIES
    )
    share = prof.get("breakdown", {}).get("share", {})
    summary = ", ".join(f"{c} {share[c]:.0%}" for c in CATEGORIES if c in share)
    return ReportSection(
        id="time", title="Step time", html=html, summary=summary, figures=list(figures)
    )
