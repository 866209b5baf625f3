"""The run's verdict in one word, and which finding leads: the most severe measured consequence.

Every finding at medium or above costs the run its training (``broken``), its numerics or its
time (``speed``) (`consequence`); the verdict word follows the worst present, and
`ampdiag.analysis.registry.rank` leads with it (`tier`), so lost gradients lead whatever
speed-up a switch of precision also measured. The words and what earns each: the table in
docs/how-it-works.md ("The verdict"). A separate field from the session's ``status`` (whether
the block ran to its end): a run that ran to its end and diverged is ``status ok``,
``diverged``. Stored by `ampdiag.analysis.analyze` as ``derived.verdict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ampdiag.session import Finding, Session

Consequence = Literal["broken", "numerics", "speed"]

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
#: Findings that say the run failed to train, in the order the verdict names them.
BROKEN = ("out-of-memory", "diverged", "stalled", "nothing-measured")
#: Findings outside the time sections that are speed claims all the same: the low-precision
#: speed-up is not in effect, or the work is done twice.
SPEED_IDS = frozenset(
    {"fp32-ops-in-autocast", "low-precision-inactive", "amp-off", "redundant-allreduce"}
)
#: Precision advice: a speed claim unless it says the run's precision loses numerics
#: (``evidence.consequence``, set by `ampdiag.analysis.advisors.recommendations`).
PRECISION_ADVICE = frozenset({"prefer-bf16", "prefer-fp32", "prefer-fp16"})
TIERS: dict[Consequence, int] = {"broken": 0, "numerics": 1, "speed": 2}


def consequence(finding: Finding) -> Consequence:
    """What a finding's problem costs the run: its training, its numerics, or its time."""
    if finding.id in BROKEN:
        return "broken"
    if finding.id in PRECISION_ADVICE:
        kind = finding.evidence.get("consequence") if isinstance(finding.evidence, dict) else None
        return "numerics" if kind == "numerics" else "speed"
    if finding.section in TIME_SECTIONS or finding.id in SPEED_IDS:
        return "speed"
    return "numerics"


def tier(finding: Finding) -> int:
    """The rank of a finding's consequence (0 leads); info and low findings all rank last."""
    if finding.severity not in ("high", "medium"):
        return len(TIERS)
    return TIERS[consequence(finding)]


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
    return "slow" if all(consequence(f) == "speed" for f in actionable) else "at risk"
