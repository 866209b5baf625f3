"""Recommendations that weigh all the evidence: the pass that runs after every rule.

Rules each look at one concern and emit findings. Several findings often have one cause and one
fix: FP16 gradient underflow, a missing GradScaler, skipped steps and a collapsing loss scale
on a GPU that runs BF16 are all answered by "use BF16". An *advisor* reads the whole session
and every finding the rules produced, and returns recommendations (`Advice`): a new (or an
existing) finding plus the findings it explains. `advise()` then merges: the explained findings
leave the list and are cited inside the recommendation's evidence (``explains``: their ids,
``merged``: their full JSON), the recommendation takes the worst severity and the largest impact
of what it merged, and the list is ranked again. So a user reads one fix, not four symptoms,
and a CI gate (``--fail-on``) still sees the severity of the worst symptom.

Advisors live here, beside the rules (``ampdiag/analysis/rules/``), not among them: a module
of this package, listed in `ADVISOR_MODULES`, registered with `advisor`. They run in that
order, each on what the previous ones left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ampdiag.analysis.registry import failed, rank
from ampdiag.registry import Registered, Registry, registering
from ampdiag.session import SEVERITIES, Finding, Session
from ampdiag.units import number as _number

#: Modules of this package whose advisors run, in this order.
ADVISOR_MODULES: tuple[str, ...] = ("divergence", "recommendations")


@dataclass
class Advice:
    """One recommendation and the findings it explains.

    Attributes:
        finding: The recommendation. It may be a finding already in the list (then it is kept
            once and only gains the findings it explains).
        explains: Findings from the list that this recommendation answers; they are removed
            from the list and cited in the recommendation's evidence.
    """

    finding: Finding
    explains: list[Finding] = field(default_factory=list)


AdvisorFunc = Callable[[Session, list[Finding]], Iterable[Advice]]


#: A registered advisor: the ids it may emit (or re-emit), ``func(session, findings)``, its doc.
Advisor = Registered[AdvisorFunc]
ADVISORS: Registry[Advisor] = Registry(__name__, ADVISOR_MODULES)


def advisor(*ids: str) -> Callable[[AdvisorFunc], AdvisorFunc]:
    """Registers an advisor that may emit recommendations with the given ids."""
    return registering(ADVISORS, ids)


def advisors() -> list[Advisor]:
    """Every registered advisor, in `ADVISOR_MODULES` order (importing them on first use)."""
    return ADVISORS.entries()


def worst_severity(findings: Iterable[Finding]) -> str:
    """The most severe of the findings' severities ("info" for none)."""
    levels = [SEVERITIES.index(f.severity) for f in findings if f.severity in SEVERITIES]
    return SEVERITIES[min(levels)] if levels else "info"


def _merge(advice: Advice, pool: list[Finding]) -> None:
    rec = advice.finding
    explained = [f for f in advice.explains if f is not rec]
    if explained:
        ids = list(rec.evidence.get("explains", []))
        merged = list(rec.evidence.get("merged", []))
        for f in explained:
            if f.id not in ids:
                ids.append(f.id)
            merged.append(
                {
                    "id": f.id,
                    "severity": f.severity,
                    "title": f.title,
                    "evidence": f.evidence,
                    "fix": f.fix,  # still applies: the reports show it under the recommendation
                }
            )
        rec.evidence["explains"] = ids
        rec.evidence["merged"] = merged
        rec.severity = worst_severity([rec, *explained])  # type: ignore[assignment]
        rec.impact = max([rec.impact, *(f.impact for f in explained)])
    gone = {id(f) for f in explained}
    pool[:] = [f for f in pool if id(f) not in gone]
    if not any(f is rec for f in pool):
        pool.append(rec)


def advise(session: Session, findings: list[Finding]) -> list[Finding]:
    """Runs every advisor over the rules' findings; returns the merged, ranked list.

    An advisor that fails is logged and recorded as an ``analysis-error`` info finding; the
    findings it would have merged stay as they were.
    """
    pool = list(findings)
    for adv in advisors():
        try:
            produced = list(adv.func(session, list(pool)))
            for advice in produced:
                if advice.finding.id not in adv.ids:
                    raise ValueError(f"advisor emitted undeclared id {advice.finding.id!r}")
        except Exception as exc:
            pool.append(
                failed("advisor", "An advisor", "its advice is missing", adv.func.__name__, exc)
            )
            continue
        for advice in produced:
            _merge(advice, pool)
    return rank(pool)


def find(findings: Iterable[Finding], *ids: str) -> list[Finding]:
    """The findings with one of the given ids, in list order."""
    return [f for f in findings if f.id in ids]


def number(evidence: dict[str, Any], key: str) -> float | None:
    """A finite number from evidence, or None when absent or not a number."""
    return _number(evidence.get(key), finite=True)
