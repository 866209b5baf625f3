"""Reports inline in Jupyter: the HTML report in a sandboxed iframe, sized for a cell.

The report is a whole document with its own CSS and Content-Security-Policy; put straight into
a notebook's page its styles would leak into the notebook. An ``<iframe srcdoc=...>`` with an
empty ``sandbox`` keeps it apart, runs no script and loads nothing from the network.

The data classes (`Session`, `SessionDiff`, `Diagnosis`) import no renderer: ``import ampdiag``
hands IPython one formatter per type in `DISPLAYS`, by the type's name, so a Session shows as
its report in a notebook while ``ampdiag.session`` stays free of rendering (and of a cycle).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from ampdiag.analysis.diff import SessionDiff
from ampdiag.render.console import summary
from ampdiag.render.diff import diff_html, diff_text
from ampdiag.render.html import render_html
from ampdiag.session import Session

CELL_HEIGHT_PX = 640


def inline(document: str, height: int = CELL_HEIGHT_PX) -> str:
    """An HTML document as a self-contained, sandboxed iframe for a notebook cell."""
    return (
        f'<iframe srcdoc="{html.escape(document, quote=True)}" sandbox '
        f'style="width:100%;height:{height}px;border:1px solid #d0d7de;border-radius:4px">'
        "</iframe>"
    )


def session_html(session: Session) -> str:
    """The session's report, inline."""
    return inline(render_html(session))


def diff_inline(d: SessionDiff) -> str:
    """A before/after diff, inline."""
    return inline(diff_html(d), height=480)


def diagnosis_html(d: Any) -> str:
    """A `Diagnosis` or `WindowedDiagnosis`: its report once the block ended, else its path."""
    if d.session is not None:
        return session_html(d.session)
    where = html.escape(str(d.report_path))
    return f"<p>ampdiag: diagnosing; the report will be at <code>{where}</code></p>"


#: (module, type name) -> its HTML and its plain text in a notebook.
DISPLAYS: dict[tuple[str, str], tuple[Callable[[Any], str], Callable[[Any], str] | None]] = {
    ("ampdiag.session", "Session"): (session_html, summary),
    ("ampdiag.analysis.diff", "SessionDiff"): (diff_inline, diff_text),
    ("ampdiag.sources.live.diagnosis", "Diagnosis"): (diagnosis_html, None),
    ("ampdiag.sources.live.windowed", "WindowedDiagnosis"): (diagnosis_html, None),
}
