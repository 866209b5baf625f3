"""Sources: everything a Session is made from.

- `live`: a run under ``diagnose()`` (the engine, discovery hooks and collectors);
- `traces`: a Kineto trace file or a folder of ranks' traces;
- `snapshot`: a CUDA allocator snapshot pickle (read without running code from it);
- a saved session is read by `ampdiag.session.load`;
- `load` (public as ``ampdiag.load``) opens any of them, by what the path holds.

Each produces a `ampdiag.session.Session`; `ampdiag.analysis` derives from it and
`ampdiag.render` formats it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ampdiag.errors import InputError

if TYPE_CHECKING:
    from ampdiag.session import Session


def load(path: str | os.PathLike[str], *, hta: bool = False) -> Session:
    """Opens any path ampdiag reads as a Session (what ``ampdiag report PATH`` reads).

    Args:
        path: A saved session (its folder or its session.json); a distributed run's folder
            (``rank-N/`` sessions, merged); a Kineto trace file or a folder of ranks'
            traces; or a CUDA memory snapshot (``.pickle``, read without running its code).
        hta: For traces, also compute the figures that need HolisticTraceAnalysis.

    Returns:
        The Session, not yet re-analyzed (``ampdiag.analyze(session)`` gives its findings
        with this ampdiag's rules).

    Raises:
        InputError: The path does not exist or holds nothing ampdiag reads.
    """
    from ampdiag.session import SESSION_FILE
    from ampdiag.session import load as load_session
    from ampdiag.sources.ranks import is_derived, rank_folders, session_from_ranks

    path = Path(path)
    try:
        if not path.exists():
            raise InputError(f"no such file or folder: {str(path)!r}")
        if path.is_dir():
            next(path.iterdir(), None)  # an unlistable folder: one line, not a traceback
        if path.is_dir() and rank_folders(path):  # a distributed run: the ranks' own sessions
            return session_from_ranks(path, hta=hta)
        if path.name == SESSION_FILE:
            return load_session(path)
        if path.is_dir() and (path / SESSION_FILE).is_file():
            saved = load_session(path)  # read once: returned, unless it is a report's own output
            if not is_derived(saved):
                return saved
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {str(path)!r}: not UTF-8 text ({exc.reason})") from None
    if path.suffix in (".pickle", ".pkl"):  # a CUDA memory snapshot: loaded without code
        from ampdiag.sources.snapshot import session_from_snapshot

        snapshot_session: Session = session_from_snapshot(path)
        return snapshot_session
    from ampdiag.sources.traces import session_from_traces

    return session_from_traces(path, hta=hta)
