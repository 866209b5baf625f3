"""Memory: the timeline by category, the breakdown at the peak, CUDA allocator facts, what-ifs.

The what-if estimates are the derive step's (``derived.memory``); this module only formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "Memory"
NEEDS = "the memory collector (allocator events or a CUDA snapshot)"

MiB = 1024**2


def _figures(mem: Mapping[str, Any]) -> dict[str, Markup]:
    figures: dict[str, Markup] = {}
    tl = mem.get("timeline") or {}
    if tl.get("t_ms"):
        series = {
            str(c): [v / MiB for v in values] for c, values in tl["bytes"].items() if any(values)
        }
        if series:
            figures["memory-timeline"] = svg.inline(
                charts.line(
                    tl["t_ms"],
                    series,
                    "ms (profiled steps)",
                    "MiB",
                    "Memory by category",
                    kind="area",
                )
            )
    by_cat = (mem.get("peak") or {}).get("by_category") or {}
    nonzero = [(c, v) for c, v in by_cat.items() if v]
    if nonzero:
        nonzero.sort(key=lambda cv: -cv[1])
        figures["memory-peak"] = svg.inline(
            charts.bars(
                [c for c, _ in nonzero],
                {"MiB": [v / MiB for _, v in nonzero]},
                "MiB",
                "At the peak",
                horizontal=True,
            )
        )
    cuda = mem.get("cuda") or {}
    cuda_tl = cuda.get("timeline") or {}
    if len(cuda_tl.get("event", [])) >= 2:
        peak_at = (cuda.get("peak") or {}).get("event_index")
        figures["cuda-allocator"] = svg.inline(
            charts.line(
                cuda_tl["event"],
                {
                    "allocated MiB": [v / MiB for v in cuda_tl["allocated"]],
                    "reserved MiB": [v / MiB for v in cuda_tl["reserved"]],
                },
                "allocator event",
                "MiB",
                "CUDA allocator: allocated vs reserved (the peak marked)",
                # the timeline's points are "after event i - 1": the peak is point index + 1
                marks=[int(peak_at) + 1] if isinstance(peak_at, int) else (),
            )
        )
    return figures


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The memory section, when the session has a memory section."""
    mem = session.section("memory")
    if not mem:
        return None
    figures = _figures(mem)
    what = session.section("derived").get("memory") or {}
    html = render_template(
        "memory.html.j2", mem=mem, what=what, figures=figures, cuda=mem.get("cuda") or {}
    )
    peak = (mem.get("peak") or {}).get("bytes")
    summary = f"peak {humanize.nbytes(peak)}" if peak else ""
    ms = what.get("model_state_bytes")
    if ms:
        summary += (", " if summary else "") + f"model state {humanize.nbytes(ms)}"
    return ReportSection(
        id="memory", title=TITLE, html=html, summary=summary, figures=list(figures)
    )
