"""Analysis: pure functions from a Session to findings, one module per concern."""

from __future__ import annotations

from ampdiag.analysis.registry import Rule, rule, rules, run_rules
from ampdiag.session import Finding, Session


def analyze(session: Session) -> list[Finding]:
    """Runs every registered rule on the session and returns the ranked findings."""
    return run_rules(session)


__all__ = ["Rule", "analyze", "rule", "rules", "run_rules"]
