"""Reports inline in Jupyter: the HTML report in a sandboxed iframe, sized for a cell.

The report is a whole document with its own CSS and Content-Security-Policy; put straight into
a notebook's page its styles would leak into the notebook. An ``<iframe srcdoc=...>`` with an
empty ``sandbox`` keeps it apart, runs no script and loads nothing from the network.
"""

from __future__ import annotations

import html

from ampdiag.analysis.diff import SessionDiff
from ampdiag.render.diff import diff_html
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
