"""Analysis: pure functions from a Session to findings, one module per concern."""

from __future__ import annotations

from ampdiag.analysis.registry import Rule, rule, rules, run_rules
from ampdiag.session import Finding, Session


def analyze(session: Session) -> list[Finding]:
    """Derives the report's figures, runs every rule, then the advisors; returns the findings.

    The derive step (`ampdiag.analysis.derive`) stores what it computes on the session as its
    ``derived`` section, for the renderers, which only format.

    The advisors (`ampdiag.analysis.advisors`) run after all rules: they weigh every finding and
    merge the ones that one recommendation explains. Last, the verdict's category
    (`ampdiag.analysis.verdict`) is stored as ``derived.verdict``.
    """
    from ampdiag.analysis.advisors import advise
    from ampdiag.analysis.derive import derive
    from ampdiag.analysis.ranks import merge_findings, rank_findings
    from ampdiag.analysis.verdict import category

    derive(session)
    per_rank = rank_findings(session, analyze)
    if per_rank:  # a merged distributed run: each rank alone, then the ranks together
        together = Session(
            status=session.status,
            environment=session.environment,
            sections={k: v for k, v in session.sections.items() if k == "timeline"},
        )
        found = merge_findings(per_rank, advise(together, run_rules(together)))
    else:
        found = advise(session, run_rules(session))
    session.sections["derived"]["verdict"] = category(session, found)
    return found


__all__ = ["Rule", "analyze", "rule", "rules", "run_rules"]
