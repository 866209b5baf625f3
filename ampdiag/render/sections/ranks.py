"""The ranks of a distributed run side by side: a table and their step times on one chart.

Reads the merged session's ``ranks`` section (`ampdiag.sources.ranks`) and, where the ranks'
traces were read, the timeline's communication figures per rank.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units
from ampdiag.render import charts, svg, templating
from ampdiag.render.sections import ReportSection, section
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
    html = _html(ranks, rows, comm, straggler, uris)
    slow = max(rows, key=lambda r: r.get("step_ms_median") or 0.0)
    summary = f"{len(rows)} ranks" + (
        f", rank {straggler} is the straggler" if straggler is not None else ""
    )
    if slow.get("step_ms_median") is not None and straggler is None:
        summary += f", slowest median step {slow['step_ms_median']:.1f} ms (rank {slow['rank']})"
    return ReportSection(id="ranks", title=TITLE, html=html, summary=summary, figures=list(uris))


_HEAD = ("rank", "status", "#steps", "#median step", "#last loss", "#non-finite grads",
         "#zero grads", "autocast", "#low-precision FLOPs", "#parameters", "#peak memory",
         "#collectives / step", "#exposed comm / step", "#waits for others / step",
         "findings")  # fmt: skip


def _html(ranks: Any, rows: list[dict[str, Any]], comm: Any, straggler: Any, uris: Any) -> Markup:
    """One row per rank: its status, step time, numerics, memory, communication and findings."""

    def number(value: Any, fmt: Any) -> Any:
        return fmt(value) if isinstance(value, (int, float)) else ""

    matched = (
        Markup("; {} collectives matched across the ranks' traces").format(comm["matched"])
        if comm.get("matched")
        else ""
    )
    row = Markup(
        '<tr><td>{}{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td>'
        '<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>'
        "<td><code>{}</code></td>"
        '<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td>\n'
        '<td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td></tr>'
    )
    body = []
    for r in rows:
        c = r.get("comm") or {}
        body.append(
            row.format(
                r["rank"],
                Markup(" <strong>(straggler)</strong>") if r["rank"] == straggler else "",
                r["status"],
                r["steps"],
                number(r.get("step_ms_median"), lambda v: f"{v:.1f} ms"),
                units.by_key("", r["last_loss"]),
                units.by_key("", r["grad_nonfinite"]),
                number(r.get("grad_zero_fraction"), units.percent),
                r["autocast"] or "off",
                number(r.get("low_precision_flops_share"), units.percent),
                number(r.get("parameter_bytes"), units.nbytes),
                number(r.get("peak_bytes"), units.nbytes),
                f"{c['count']:.1f}" if c else "",
                units.micros(c["exposed_us"]) if c else "",
                number(r.get("wait_us"), units.micros),
                templating.join(
                    Markup("<code>{}</code> ").format(f) for f in r.get("findings", [])
                ),
            )
        )
    warnings = ranks.get("warnings")
    return Markup(
        "<p>{} ranks of a world of {}, each from its own session{}.</p>\n<table>\n"
        "<thead><tr>{}</tr></thead>\n<tbody>\n{}</tbody></table>\n{}{}"
    ).format(
        len(rows),
        ranks.get("world_size"),
        matched,
        templating.heads(*_HEAD),
        templating.join(body),
        templating.figures(uris),
        Markup("<ul>{}</ul>").format(
            templating.join(Markup('<li class="muted">{}</li>').format(w) for w in warnings)
        )
        if warnings
        else "",
    )
