"""The overview: the verdict in a sentence.

The report adds the top recommendations and the table of every finding below it (html.py).
"""

from __future__ import annotations

import statistics

from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import SEVERITIES, Finding, Session

TITLE = "Overview"


def verdict(session: Session) -> str:
    """One sentence: what is most wrong with this run (or that nothing was found)."""
    if session.status == "error" and session.error:
        head = f"The run stopped with {session.error.get('type', 'an error')}. "
    elif session.status == "interrupted":
        head = "The run was interrupted. "
    else:
        head = ""
    actionable = [f for f in session.findings if f.severity in ("high", "medium")]
    if not actionable:
        return head + "No problem above the documented thresholds was found."
    top: Finding = actionable[0]
    explains = top.evidence.get("explains") if isinstance(top.evidence, dict) else None
    because = (
        f" (this explains {len(explains)} finding{'s' if len(explains) != 1 else ''})"
        if isinstance(explains, list) and explains
        else ""
    )
    more = len(actionable) - 1
    tail = f" {more} more finding{'s' if more != 1 else ''} below." if more else ""
    title = top.title.rstrip(".")
    return f"{head}{title}{because}.{tail}"


def counts(session: Session) -> str:
    """The findings counted by severity, e.g. "2 high, 1 medium findings"."""
    parts = []
    for sev in SEVERITIES:
        n = sum(1 for f in session.findings if f.severity == sev)
        if n:
            parts.append(f"{n} {sev}")
    if not parts:
        return "no findings"
    return ", ".join(parts) + " finding" + ("s" if len(session.findings) != 1 else "")


def build(session: Session) -> ReportSection:
    """The overview section (always present)."""
    text = verdict(session)
    walls = [s.get("wall_s") for s in session.steps[1:] or session.steps]
    values = [float(w) * 1000 for w in walls if isinstance(w, (int, float))]
    html = render_template(
        "overview.html.j2",
        session=session,
        verdict=text,
        median_ms=statistics.median(values) if values else None,
        counts=counts(session),
    )
    return ReportSection(id="overview", title=TITLE, html=html, summary=text)
