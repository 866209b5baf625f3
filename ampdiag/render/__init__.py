"""Renderers: each reads only a Session (and its findings) and writes one kind of output."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ampdiag.session import Session

if TYPE_CHECKING:
    from ampdiag.config import DiagnoseConfig

log = logging.getLogger("ampdiag")


def render_all(session: Session, out: Path, config: DiagnoseConfig | None = None) -> None:
    """Writes report.html, tensorboard/ and the console summary, as the config asks.

    A renderer that fails is reported on stderr and the others still run: the session on disk
    is what matters, and ``ampdiag report`` can re-render it.
    """
    from ampdiag.render.console import summary
    from ampdiag.render.html import write_html
    from ampdiag.render.tensorboard import write_tensorboard

    report: Path | None = None
    if config is None or config.report:
        try:
            report = write_html(session, out)
        except Exception as exc:
            print(f"ampdiag: the HTML report failed: {exc!r}", file=sys.stderr)
    if config is None or config.tensorboard:
        try:
            write_tensorboard(session, out)
        except Exception as exc:
            print(f"ampdiag: the TensorBoard output failed: {exc!r}", file=sys.stderr)
    if config is None or config.console:
        print(summary(session, report), file=sys.stderr)
