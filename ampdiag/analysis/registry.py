"""The rule registry: pure functions Session -> findings, registered by decorator.

A rule module lives in ``ampdiag/analysis/rules/`` and is listed in that package's
``RULE_MODULES`` (`RULES`, an `ampdiag.registry.Registry`); each rule declares the finding ids
it may emit, so ids stay unique and documented. Rules never touch a live model: they read the
Session only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from ampdiag.analysis.rules import RULE_MODULES
from ampdiag.registry import Registered, Registry, registering
from ampdiag.session import SEVERITIES, Finding, Session

log = logging.getLogger("ampdiag")

RuleFunc = Callable[[Session], Iterable[Finding]]


#: A registered rule: the finding ids it may emit, the rule, its docstring.
Rule = Registered[RuleFunc]
RULES: Registry[Rule] = Registry("ampdiag.analysis.rules", RULE_MODULES, ids=lambda r: r.ids)


def rule(*ids: str) -> Callable[[RuleFunc], RuleFunc]:
    """Registers a rule that may emit findings with the given ids."""
    return registering(RULES, ids)


def rules() -> list[Rule]:
    """Every registered rule, in `RULE_MODULES` order (importing the rule modules)."""
    return RULES.entries()


def rank(findings: Iterable[Finding]) -> list[Finding]:
    """Orders findings by consequence, severity, expected impact, then id (stable).

    Actionable findings (medium and above) come first, the most severe consequence leading
    (`ampdiag.analysis.verdict.tier`: a run that failed to train, then lost numerics, then
    speed), so the verdict sentence names what matters most; then by severity and impact.
    """
    from ampdiag.analysis.verdict import tier

    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (tier(f), order.get(f.severity, 99), -f.impact, f.id))


def run_rules(session: Session) -> list[Finding]:
    """Runs every rule on the session and returns the findings, ranked.

    A rule that fails is logged and skipped (recorded as an ``analysis-error`` info finding):
    one broken rule must not cost the user the rest of the report.
    """
    found: list[Finding] = []
    for r in rules():
        try:
            for finding in r.func(session):
                if finding.id not in r.ids:
                    raise ValueError(f"rule emitted undeclared id {finding.id!r}")
                found.append(finding)
        except Exception as exc:
            found.append(
                failed("rule", "An analysis rule", "its findings are missing", r.func.__name__, exc)
            )
    return rank(found)


def failed(kind: str, what: str, lost: str, name: str, exc: Exception) -> Finding:
    """The ``analysis-error`` info finding (and log line) of a rule or advisor that raised."""
    log.warning("%s %s failed: %r", kind, name, exc)
    return Finding(
        id="analysis-error",
        severity="info",
        title=f"{what} failed ({name}); {lost}.",
        evidence={kind: name, "error": repr(exc)},
    )
