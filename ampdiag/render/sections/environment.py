"""The run's environment, settings and what diagnose() found by itself."""

from __future__ import annotations

from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TITLE = "Run and environment"


@section(TITLE)
def build(session: Session) -> ReportSection:
    """The environment section (always present)."""
    html = render_template("environment.html.j2", session=session, run=session.section("run"))
    return ReportSection(id="environment", title=TITLE, html=html)
