"""The GPU timeline: idle / compute / non-compute per rank, kernels, precision, idle causes."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "GPU timeline"

DETAIL_RANKS = 2
#: At most this many per-step rows per rank in the table.
TABLE_STEPS = 50
#: At most this many devices' memory curves per rank.
MEMORY_DEVICES = 4
#: A device's curve is drawn when its peak is at least this share of the rank's highest peak
#: (the table states every device's peak): a GPU trace's CPU allocations (8 bytes at most in
#: df_index_resolver) would take a chart of their own.
MEMORY_CHART_SHARE = 0.01


@section(TITLE)
def build(session: Session) -> ReportSection | None:
    """The timeline section, when the session has a ``timeline`` section with ranks."""
    tl = session.section("timeline")
    ranks: list[dict[str, Any]] = [r for r in tl.get("ranks", []) if isinstance(r, dict)]
    if not ranks:
        return None
    summary = tl.get("summary", {})
    gpu = [r for r in ranks if r.get("activities_in_window")]
    detail = gpu[:1]
    slow = next((r for r in gpu if r["rank"] == summary.get("slowest_rank")), None)
    if slow is not None and slow not in detail and len(detail) < DETAIL_RANKS:
        detail.append(slow)
    figures: dict[str, Markup] = {}
    if gpu:
        shown = gpu
        figures["gpu-time"] = svg.inline(
            charts.bars(
                [f"rank {r['rank']}" for r in shown],
                {
                    "compute": [r["compute_us"] / 1000 for r in shown],
                    "non-compute": [r["non_compute_us"] / 1000 for r in shown],
                    "idle": [r["idle_us"] / 1000 for r in shown],
                },
                "ms",
                "GPU time by rank",
                unit="ranks",
            )
        )
        top = detail[0]["top_kernels"][:10]
        if top:
            figures["top-kernels"] = svg.inline(
                charts.bars(
                    [k["short_name"][:50] for k in top],
                    {"ms": [k["total_us"] / 1000 for k in top]},
                    "ms",
                    f"Top kernels, rank {detail[0]['rank']}",
                    horizontal=True,
                )
            )
    cpu_only = [r for r in ranks if not r.get("activities_in_window")][:2]
    memory_figures = {
        r["rank"]: _memory_charts(r["memory"], r["rank"])
        for r in detail + cpu_only
        if r.get("memory")
    }
    html = render_template(
        "timeline.html.j2",
        tl=tl,
        ranks=ranks,
        summary=summary,
        detail=detail,
        cpu_only=cpu_only,
        figures=figures,
        hta=tl.get("hta") or {},
        table_steps=TABLE_STEPS,
        memory_figures=memory_figures,
    )
    if gpu:
        r = gpu[0]
        text = (
            f"rank {r['rank']}: idle {units.percent(r['idle_share'])}, "
            f"compute {units.percent(r['compute_share'])}, "
            f"non-compute {units.percent(r['non_compute_share'])}"
        )
    else:
        text = "no GPU kernels (CPU side only)"
    names = [*figures, *(f"memory-rank-{k}" for k in memory_figures)]
    return ReportSection(id="timeline", title=TITLE, html=html, summary=text, figures=names)


def _memory_charts(memory: dict[str, Any], rank: int) -> list[Markup]:
    """Allocated (and reserved) MiB over the trace, one chart per device, the steps marked."""
    out = []
    top = max(d["peak"]["bytes"] for d in memory["devices"])
    shown = [d for d in memory["devices"] if d["peak"]["bytes"] >= MEMORY_CHART_SHARE * top]
    for d in shown[:MEMORY_DEVICES]:
        series = {"allocated": [v / 2**20 for v in d["allocated"]]}
        if d["reserved"] and any(d["reserved"]):
            series["reserved"] = [v / 2**20 for v in d["reserved"]]
        chart = charts.line(
            d["t_ms"],
            series,
            "ms",
            "MiB",
            f"Memory, rank {rank}, {d['device']}",
            marks=[s["start_ms"] for s in memory.get("steps", [])],
        )
        out.append(svg.inline(chart))
    return out
