"""The precision section: what ran in low precision and what in FP32, why, and where."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ampdiag.analysis.precision import REASON_FIXES, summarize
from ampdiag.render import plots
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session

MAX_MODULES = 20


@plots.memoized
def module_bars(modules: dict[str, dict[str, float]], limit: int = MAX_MODULES) -> bytes:
    """Horizontal stacked bars: per module, op time in low precision and in FP32."""
    plt = plots._pyplot()
    names = sorted(modules, key=lambda m: -(modules[m]["low_time_us"] + modules[m]["fp32_time_us"]))
    names = names[:limit]
    low = [modules[m]["low_time_us"] / 1000 for m in names]
    fp32 = [modules[m]["fp32_time_us"] / 1000 for m in names]
    fig, ax = plt.subplots(figsize=(7, 0.32 * max(3, len(names)) + 1.0))
    labels: Sequence[str] = list(reversed(names))
    ax.barh(labels, list(reversed(low)), label="low precision", color="tab:green")
    ax.barh(labels, list(reversed(fp32)), left=list(reversed(low)), label="FP32", color="tab:red")
    ax.set_xlabel("op time (ms)")
    ax.set_title("Low-precision vs FP32 work per module (audited step)")
    ax.legend(fontsize=8, loc="lower right")
    return plots.figure_png(fig)


def build(session: Session) -> ReportSection | None:
    """The precision section, when the run was audited (or says why it was not)."""
    sec = session.section("precision")
    if not sec:
        return None
    if not sec.get("audited"):
        html = render_template("precision.html.j2", sec=sec, s=None, figures={}, fixes={})
        return ReportSection(id="precision", title="Precision", html=html, summary="not audited")
    s = summarize(sec)
    figures: dict[str, str] = {}
    if s["modules"]:
        figures["precision-modules"] = plots.data_uri(module_bars(s["modules"]))
    html = render_template("precision.html.j2", sec=sec, s=s, figures=figures, fixes=REASON_FIXES)
    summary = (
        f"FP32 {s['fp32_flops_share']:.0%} of FLOPs, {s['fp32_time_share']:.0%} of op time; "
        f"{s['casts']['total']['count']} casts"
    )
    return ReportSection(
        id="precision", title="Precision", html=html, summary=summary, figures=list(figures)
    )


def write_tensorboard(session: Session, writer: Any) -> None:
    """Scalars: FP32 share of FLOPs and time, cast count and bytes of the audited step."""
    sec = session.section("precision")
    if not sec.get("audited"):
        return
    s = summarize(sec)
    step = int(sec.get("step") or 0)
    writer.add_scalar("precision/fp32_flops_share", s["fp32_flops_share"], step)
    writer.add_scalar("precision/fp32_time_share", s["fp32_time_share"], step)
    writer.add_scalar("precision/casts", s["casts"]["total"]["count"], step)
    writer.add_scalar("precision/cast_bytes", s["casts"]["total"]["bytes"], step)
