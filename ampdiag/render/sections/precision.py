"""The precision section: what ran in low precision and what in FP32, why, and where.

The summary it shows is the derive step's (``derived.precision``); this module only formats.
"""

from __future__ import annotations

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "Precision"
NEEDS = "the dtype audit of a sampled step under autocast"

MAX_MODULES = 20


def module_bars(modules: dict[str, dict[str, float]], limit: int = MAX_MODULES) -> charts.Chart:
    """Horizontal stacked bars: per module, op time in low precision and in FP32."""
    names = sorted(modules, key=lambda m: -(modules[m]["low_time_us"] + modules[m]["fp32_time_us"]))
    names = names[:limit]
    return charts.bars(
        names,
        {
            "low precision": [modules[m]["low_time_us"] / 1000 for m in names],
            "FP32": [modules[m]["fp32_time_us"] / 1000 for m in names],
        },
        "op time (ms)",
        "Low-precision vs FP32 work per module (audited step)",
        horizontal=True,
        colors=("#2ca02c", "#d62728"),
    )


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The precision section, when the run was audited (or says why it was not)."""
    sec = session.section("precision")
    if not sec:
        return None
    s = session.section("derived").get("precision")
    if not sec.get("audited") or s is None:
        reason = sec.get("not_audited_reason") or "the session was not analysed"
        html = render_template("precision.html.j2", sec=sec, s=None, figures={}, reason=reason)
        return ReportSection(id="precision", title=TITLE, html=html, summary="not audited")
    figures: dict[str, Markup] = {}
    if s.get("modules"):
        figures["precision-modules"] = svg.inline(module_bars(s["modules"]))
    html = render_template("precision.html.j2", sec=sec, s=s, figures=figures, reason="")
    summary = (
        f"FP32 {humanize.percent(s['fp32_flops_share'])} of FLOPs, "
        f"{humanize.percent(s['fp32_time_share'])} of op time; "
        f"{humanize.count(s['casts']['total']['count'])} casts"
    )
    return ReportSection(
        id="precision", title=TITLE, html=html, summary=summary, figures=list(figures)
    )
