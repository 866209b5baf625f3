"""The headline figures as the session holds them: what every surface states, read, not computed.

`ampdiag.analysis.figures` computes each figure once (step time, loss, memory peak, FP16
underflow, skipped steps, loss scale, speed against FP32) and the derive step stores them as
``derived.figures``; the HTML report, the console and TensorBoard read them here, so no two
surfaces state two values of one quantity. A session that was never analysed has none: the
surfaces then state no such figure rather than compute their own.
"""

from __future__ import annotations

from ampdiag.schema import Compute, Figures
from ampdiag.session import Session


def figures(session: Session) -> Figures:
    """The session's ``derived.figures`` (empty when it was not analysed)."""
    return session.section("derived").get("figures") or {}


def compute(session: Session) -> Compute | None:
    """``derived.compute``: what the run computes in (None: not analysed)."""
    return session.section("derived").get("compute")


def autocast(session: Session) -> str | None:
    """The low-precision autocast the run entered ("cpu:bfloat16"; None: none, not analysed)."""
    computed = compute(session)
    return computed["autocast"] if computed else None
