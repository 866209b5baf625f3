"""A reloaded session is the live one: the same findings and figures after save and load.

session.json cannot hold NaN or inf (strict JSON), so they are written as strings; `load`
must read them back as the floats they were, or every "is this a number" check downstream
reads a reloaded NaN loss as missing and the findings of a diverged run change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ampdiag
from ampdiag.analysis import analyze
from ampdiag.render.plot import session_charts
from ampdiag.session import Session, dumps
from tests.scenarios.harness import all_scenarios

# a NaN loss (diverged, not precision), an FP16 NaN the scaler skips, and a healthy control
NAMES = ("diverge-lr-fp32", "nan-loss-early", "healthy-mlp-bf16")


def _state(session: Session) -> tuple[str, str, str]:
    """Findings, derived figures and charts, as text (NaN == NaN there)."""
    findings = analyze(session)
    return (
        dumps({"findings": [f.to_dict() for f in findings]}),
        dumps({"derived": session.sections.get("derived", {})}),
        repr(session_charts(session)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_reloaded_session_gives_the_same_findings_and_figures(name: str, tmp_path: Path) -> None:
    scenario = next(s for s in all_scenarios() if s.name == name)
    live, _ = scenario.run(tmp_path / name)
    assert live.path is not None
    reloaded = ampdiag.load(live.path)
    assert [s.get("loss") for s in reloaded.steps] == pytest.approx(
        [s.get("loss") for s in live.steps], nan_ok=True
    )
    assert _state(reloaded) == _state(live)
