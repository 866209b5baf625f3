"""The ranks of a distributed run side by side: a table and their step times on one chart.

Reads the merged session's ``ranks`` section (`ampdiag.sources.ranks`) and, where the ranks'
traces were read, the timeline's communication figures per rank.
"""

from __future__ import annotations

from typing import Any

from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "Ranks"


def _rows(session: Session) -> list[dict[str, Any]]:
    """The ranks' rows, with their communication per step and findings added."""
    timeline = session.section("timeline")
    comm = {r.get("rank"): (r.get("collectives") or {}) for r in timeline.get("ranks", [])}
    waits = timeline.get("communication", {}).get("wait_us_per_step", {})
    rows = []
    for row in session.section("ranks").get("rows", []):
        r = dict(row)
        c = comm.get(r["rank"])
        if c and c.get("source"):
            r["comm"] = c.get("per_step")
        r["wait_us"] = waits.get(str(r["rank"]))
        r["findings"] = sorted(
            {
                f.id
                for f in session.findings
                if f.evidence.get("ranks") == "all"
                or r["rank"] in (f.evidence.get("ranks") or [])
                or f.evidence.get("rank") == r["rank"]
            }
        )
        rows.append(r)
    return rows


def figures(session: Session) -> dict[str, charts.Chart]:
    """The per-rank step-time chart, when the ranks recorded two steps or more."""
    rows = session.section("ranks").get("rows", [])
    series = {f"rank {r['rank']}": r.get("step_times_ms") or [] for r in rows}
    n = min((len(v) for v in series.values()), default=0)
    if n < 2:
        return {}
    return {
        "rank-step-times": charts.line(
            list(range(n)),
            {k: v[:n] for k, v in series.items()},
            "step",
            "ms",
            "Wall time per step, by rank",
        )
    }


@section(TITLE)
def build(session: Session) -> ReportSection | None:
    """The ranks section, for a merged distributed run."""
    ranks = session.section("ranks")
    if not ranks.get("rows"):
        return None
    comm = session.section("timeline").get("communication", {})
    straggler = (comm.get("straggler") or {}).get("rank")
    if not any(f.id == "straggler-rank" for f in session.findings):
        straggler = None
    rows = _rows(session)
    uris = {name: svg.inline(chart) for name, chart in figures(session).items()}
    html = render_template(
        "ranks.html.j2", ranks=ranks, rows=rows, comm=comm, straggler=straggler, figures=uris
    )
    slow = max(rows, key=lambda r: r.get("step_ms_median") or 0.0)
    summary = f"{len(rows)} ranks" + (
        f", rank {straggler} is the straggler" if straggler is not None else ""
    )
    if slow.get("step_ms_median") is not None and straggler is None:
        summary += f", slowest median step {slow['step_ms_median']:.1f} ms (rank {slow['rank']})"
    return ReportSection(id="ranks", title=TITLE, html=html, summary=summary, figures=list(uris))
