"""The settings the run was diagnosed with (``session.config``), the changed ones first.

A reader comparing two reports sees at once that one of them sampled every step, say.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from markupsafe import Markup

from ampdiag.config import DiagnoseConfig
from ampdiag.render.sections import ReportSection, section
from ampdiag.session import Session

TITLE = "Settings"


@section(TITLE)
def build(session: Session) -> ReportSection | None:
    """The table of settings; None for a session that has none (one read from a trace)."""
    config = session.config
    if not config:
        return None
    defaults = {f.name: f.default for f in fields(DiagnoseConfig) if f.default is not MISSING}
    changed = [k for k in config if k in defaults and config[k] != defaults[k]]
    rest = [k for k in config if k not in changed]
    row = Markup("<tr><th><code>{}</code></th><td>{}</td><td>{}</td></tr>")
    rows = [row.format(k, _shown(config[k]), f"default {_shown(defaults[k])}") for k in changed]
    rows += [row.format(k, _shown(config[k]), "") for k in rest]
    html = Markup("<table><tbody>") + Markup("").join(rows) + Markup("</tbody></table>")
    summary = f"{len(changed)} changed from the default" if changed else "all defaults"
    return ReportSection(id="settings", title=TITLE, html=html, summary=summary)


def _shown(value: object) -> object:
    """A setting as a reader reads it: ``None`` is "not set" (its documented automatic choice)."""
    return "not set (automatic)" if value is None else value
