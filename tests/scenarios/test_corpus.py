"""Every scenario of the corpus, asserted in full: the right findings, naming the right module,
step and numbers (within the scenario's tolerances), none of the forbidden ones, and no two
findings advising different precisions (`tests.advice_scan`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.advice_scan import contradictions
from tests.scenarios.harness import Scenario, all_scenarios, score

SCENARIOS = all_scenarios()


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
