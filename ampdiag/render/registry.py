"""The output formats: one `Renderer` per format, in one table (`RENDERERS`).

``ampdiag report --format NAME`` and `render_all` both read this table, so a new format is one
file (a class with ``name``, ``extension``, ``stdout`` and ``write(session, out)``) plus one
line below. Each renderer imports what it draws with inside ``write``: the table itself is
cheap to import (an HTML report imports no matplotlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ampdiag.render.plot import FigureFiles
from ampdiag.session import Session


class Renderer(Protocol):
    """One output format.

    Attributes:
        name: The ``--format`` value.
        extension: What it writes (a file's extension, or the kind of folder).
        stdout: It prints to stdout (``out`` unused) instead of writing under ``out``.
        setting: The `DiagnoseConfig` switch under which a live run writes it (`render_all`);
            None: only ``ampdiag report --format`` writes it.
    """

    name: str
    extension: str
    stdout: bool
    setting: str | None

    def write(self, session: Session, out: Path) -> Path | None:
        """Writes the session's output under ``out``; returns the main path written."""
        ...


class Html:
    """report.html (and the session beside it, so that its links resolve)."""

    name = extension = "html"
    stdout = False
    setting: str | None = "report"

    def write(self, session: Session, out: Path) -> Path:
        """Writes report.html into ``out`` (saving the session there when it lives elsewhere)."""
        from ampdiag.render.html import write_html

        if session.path is None or Path(out) != session.path:
            session.save(out)
        return write_html(session, out)


class TensorBoard:
    """Event files in out/tensorboard/<run>/."""

    name = extension = "tensorboard"
    stdout = False
    setting: str | None = "tensorboard"

    def write(self, session: Session, out: Path) -> Path:
        """Writes the event files; returns their folder."""
        from ampdiag.render.tensorboard import write_tensorboard

        return write_tensorboard(session, out)


class Console:
    """The summary, on stdout."""

    name = extension = "console"
    stdout = True
    setting: str | None = None

    def write(self, session: Session, out: Path) -> None:
        """Prints the summary."""
        from ampdiag.render.console import summary

        print(summary(session))


class Json:
    """The session with its findings, as JSON on stdout."""

    name = extension = "json"
    stdout = True
    setting: str | None = None

    def write(self, session: Session, out: Path) -> None:
        """Prints the session."""
        from ampdiag.session import dumps

        print(dumps(session.to_dict()))


#: Every output format, by ``--format`` name (the first is the default).
RENDERERS: dict[str, Renderer] = {
    r.name: r
    for r in (
        Html(),
        Console(),
        Json(),
        TensorBoard(),
        FigureFiles("png"),
        FigureFiles("pdf"),
    )
}
