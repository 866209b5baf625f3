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
    """Writes the outputs the config asks for (`RENDERERS`' settings), then the summary.

    A renderer that fails is reported on stderr and the others still run: the session on disk
    is what matters, and ``ampdiag report`` can re-render it.
    """
    from ampdiag.render.console import summary
    from ampdiag.render.registry import RENDERERS

    written: dict[str, Path | None] = {}
    for renderer in RENDERERS.values():
        if renderer.setting is None or not (config is None or getattr(config, renderer.setting)):
            continue
        try:
            written[renderer.name] = renderer.write(session, out)
        except Exception as exc:
            print(f"ampdiag: the {renderer.name} output failed: {exc!r}", file=sys.stderr)
    if config is None or config.console:
        print(summary(session, written.get("html")), file=sys.stderr)
