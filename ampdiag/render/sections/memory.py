"""Memory: the timeline by category, the breakdown at the peak, CUDA allocator facts, what-ifs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ampdiag.analysis import memory_estimates as estimates
from ampdiag.analysis.memory_timeline import CATEGORIES
from ampdiag.render import plots
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session

MiB = 1024**2


@plots.memoized
def stacked_area(
    x: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, title: str
) -> bytes:
    """A stacked area chart in MiB (one band per category, first at the bottom)."""
    plt = plots._pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    names = list(series)
    ax.stackplot(list(x), *[[v / MiB for v in series[n]] for n in names], labels=names, step=None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return plots.figure_png(fig)


def _figures(mem: Mapping[str, Any]) -> dict[str, str]:
    figures: dict[str, str] = {}
    tl = mem.get("timeline") or {}
    if tl.get("t_ms"):
        series = {c: tl["bytes"][c] for c in CATEGORIES if any(tl["bytes"].get(c, []))}
        if series:
            figures["memory-timeline"] = plots.data_uri(
                stacked_area(tl["t_ms"], series, "ms (profiled steps)", "Memory by category")
            )
    by_cat = (mem.get("peak") or {}).get("by_category") or {}
    nonzero = [(c, v) for c, v in by_cat.items() if v]
    if nonzero:
        nonzero.sort(key=lambda cv: -cv[1])
        figures["memory-peak"] = plots.data_uri(
            plots.hbar([c for c, _ in nonzero], [v / MiB for _, v in nonzero], "MiB", "At the peak")
        )
    cuda_tl = (mem.get("cuda") or {}).get("timeline") or {}
    if len(cuda_tl.get("event", [])) >= 2:
        figures["cuda-allocator"] = plots.data_uri(
            plots.line(
                cuda_tl["event"],
                {
                    "allocated MiB": [v / MiB for v in cuda_tl["allocated"]],
                    "reserved MiB": [v / MiB for v in cuda_tl["reserved"]],
                },
                "allocator event",
                "MiB",
                "CUDA allocator (recorded history)",
            )
        )
    return figures


def build(session: Session) -> ReportSection | None:
    """The memory section, when the session has a memory section."""
    mem = session.section("memory")
    if not mem:
        return None
    figures = _figures(mem)
    what = estimates.whatif(mem)
    html = render_template(
        "memory.html.j2", mem=mem, what=what, figures=figures, cuda=mem.get("cuda") or {}
    )
    peak = (mem.get("peak") or {}).get("bytes")
    summary = f"peak {peak / MiB:.1f} MiB" if peak else ""
    ms = what["model_state_bytes"]
    if ms:
        summary += (", " if summary else "") + f"model state {ms / MiB:.1f} MiB"
    return ReportSection(
        id="memory", title="Memory", html=html, summary=summary, figures=list(figures)
    )


def write_tensorboard(session: Session, writer: Any) -> None:
    """The peak split by category and the model state as scalars."""
    mem = session.section("memory")
    for cat, value in ((mem.get("peak") or {}).get("by_category") or {}).items():
        writer.add_scalar(f"memory/peak_{cat}_MiB", value / MiB, 0)
    for key in ("parameters", "gradients", "optimizer_state"):
        value = (mem.get("model_state") or {}).get(key)
        if isinstance(value, (int, float)):
            writer.add_scalar(f"memory/model_state_{key}_MiB", value / MiB, 0)
