"""The GradScaler: which scaler the run used, its settings, and the loss scale over the steps.

The scale history is read from the ``scaler`` section when a collector wrote one, as
``history: [{"step": int, "scale": float, "skipped": bool}, ...]``; the findings about the
scaler (missing, disabled, skipped steps, collapse, settings) are added by the report.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag.render import charts, stated, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "GradScaler"
NEEDS = "a GradScaler in the run (scale history, skipped steps)"


def scale_history(session: Session) -> list[dict[str, Any]]:
    """The per-step loss scale records that have a numeric scale."""
    rows = session.section("scaler").get("history", [])
    if not isinstance(rows, list):
        return []
    return [
        r
        for r in rows
        if isinstance(r, dict)
        and isinstance(r.get("scale"), (int, float))
        and isinstance(r.get("step"), int)
    ]


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The GradScaler section, when the run had a scaler or fp16 autocast or scaler data."""
    run = session.section("run")
    scaler = run.get("scaler")
    history = scale_history(session)
    autocast = str(session.environment.get("autocast") or "")
    if not scaler and not history and not autocast.endswith(":float16"):
        return None
    figures: dict[str, Markup] = {}
    if len(history) >= 2:
        figures["loss-scale"] = svg.inline(
            charts.line(
                [r["step"] for r in history],
                {"loss scale": [float(r["scale"]) for r in history]},
                "step",
                "scale",
                "Loss scale per step (dashed: skipped steps)",
                marks=[r["step"] for r in history if r.get("skipped")],
                logy=True,
            )
        )
    told = stated.figures(session)
    counted = told.get("skipped_steps") or {}
    # totals over every step (the history is thinned on long runs), as every surface states them
    skipped = int(counted.get("skipped", sum(1 for r in history if r.get("skipped"))))
    html = render_template(
        "gradscaler.html.j2",
        scaler=scaler,
        autocast=autocast,
        history=history,
        skipped=skipped,
        steps=int(counted.get("steps") or len(history)),
        scale=told.get("loss_scale") or {},
        figures=figures,
    )
    state = {True: "enabled", False: "disabled"}
    summary = state[bool(scaler.get("enabled"))] if scaler else "no GradScaler"
    if history:
        summary += f", {skipped} skipped step{'s' if skipped != 1 else ''}"
    return ReportSection(
        id="gradscaler", title=TITLE, html=html, summary=summary, figures=list(figures)
    )
