"""The run's verdict in one word: what a person must know first about it.

``healthy``, ``slow`` (the top problem is where the time goes), ``diverged`` / ``stalled``
(`ampdiag.analysis.divergence`), ``out of memory``, ``nothing measured``, or ``at risk``
(a problem at medium or above that is none of those: underflow, a misused GradScaler...).
A separate field from the session's ``status`` (ok / error / interrupted: whether the
block ran to its end): a run that ran to its end and diverged is ``status ok``, ``diverged``.
Stored by `ampdiag.analysis.analyze` as ``derived.verdict``; every surface's status line
reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ampdiag.session import Finding, Session

CATEGORIES = (
    "healthy",
    "slow",
    "diverged",
    "stalled",
    "out of memory",
    "nothing measured",
    "at risk",
)
#: Finding sections about where the time goes.
TIME_SECTIONS = frozenset({"time", "timeline"})


def category(session: Session, findings: Sequence[Finding]) -> str:
    """The verdict's category (one of `CATEGORIES`) from the ranked findings."""
    actionable = [f for f in findings if f.severity in ("high", "medium")]
    ids = {f.id for f in actionable}
    error = session.error or {}
    if "out-of-memory" in ids or "OutOfMemory" in str(error.get("type", "")):
        return "out of memory"
    for verdict in ("diverged", "stalled"):
        if verdict in ids:
            return verdict
    if "nothing-measured" in ids:
        return "nothing measured"
    if not actionable:
        return "healthy"
    return "slow" if actionable[0].section in TIME_SECTIONS else "at risk"
