"""Every scenario of the corpus, asserted in full: the right findings, naming the right module,
step and numbers (within the scenario's tolerances), none of the forbidden ones, and no two
findings advising different precisions (`tests.advice_scan`).

Each run is then reloaded from its session.json: the reloaded session must give the same
findings, derived figures and charts as the live one. session.json cannot hold NaN or inf
(strict JSON), so they are written as strings; `load` must read them back as the floats they
were, or every "is this a number" check downstream reads a reloaded NaN loss as missing and
the findings of a diverged run change. The derived results must also match their TypedDicts
(`ampdiag.schema.DerivedSection`) key for key: the types the rules and renderers read them by.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ampdiag
from ampdiag import schema
from ampdiag.analysis import analyze
from ampdiag.render.plot import session_charts
from ampdiag.session import Session, dumps
from tests.advice_scan import contradictions
from tests.scenarios.harness import Scenario, all_scenarios, score

SCENARIOS = all_scenarios()


def _state(session: Session) -> tuple[str, str, str]:
    """Findings, derived figures and charts, as text (NaN == NaN there)."""
    findings = analyze(session)
    return (
        dumps({"findings": [f.to_dict() for f in findings]}),
        dumps({"derived": session.sections.get("derived", {})}),
        repr(session_charts(session)),
    )


@pytest.mark.slow  # full diagnosed runs with default settings: seconds each
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(scenario: Scenario, tmp_path: Path) -> None:
    session, truth = scenario.run(tmp_path / scenario.name)
    assert session.status == scenario.status, session.error
    assert truth.expect or truth.forbid or scenario.forbid or truth.checks, (
        "a scenario must claim something"
    )
    result = score(session, scenario, truth)
    misses = [r for s in result.values() for r in s.reasons]
    assert not misses, f"{scenario.name}: {misses}; measured {truth.measured}"
    # one piece of precision advice: no two findings tell the user to train in different ones
    assert contradictions(session.findings) == [], [f.title for f in session.findings]
    doc = session.to_dict()
    assert schema.check(doc["derived"], schema.DerivedSection, "derived", strict=True) == []
    # the reloaded session is the live one (a trace's session is saved here: it has no folder)
    reloaded = ampdiag.load(session.path or session.save(tmp_path / "saved"))
    assert [s.get("loss") for s in reloaded.steps] == pytest.approx(
        [s.get("loss") for s in session.steps], nan_ok=True
    )
    assert _state(reloaded) == _state(session)
