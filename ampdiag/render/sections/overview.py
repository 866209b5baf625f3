"""The overview: the verdict in a sentence and the findings, most important first."""

from __future__ import annotations

from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Finding, Session


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
    more = len(actionable) - 1
    tail = f" ({more} more finding{'s' if more != 1 else ''} below.)" if more else ""
    return head + top.title + tail


def build(session: Session) -> ReportSection:
    """The overview section (always present)."""
    text = verdict(session)
    html = render_template("overview.html.j2", session=session, verdict=text)
    return ReportSection(id="overview", title="Overview", html=html, summary=text)
