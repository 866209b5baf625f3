"""Every scenario of the corpus, asserted in full: the right findings, naming the right module,
step and numbers (within the scenario's tolerances), none of the forbidden ones, and no two
findings advising different precisions (`tests.advice_scan`).

Each run is then reloaded from its session.json: the reloaded session must give the same
findings, derived figures and charts as the live one. session.json cannot hold NaN or inf
(strict JSON), so they are written as strings; `load` must read them back as the floats they
were, or every "is this a number" check downstream reads a reloaded NaN loss as missing and
the findings of a diverged run change. The derived results must also match their TypedDicts
(`ampdiag.schema.DerivedSection`) key for key: the types the rules and renderers read them by.

And two must-holds of every run (issue 34), each against what the run recorded, not against
the product's verdict: no finding says "not the precision" unless the FP32 replay ran and was
non-finite, the run computed in FP32 (no low-precision autocast or weights), or the finite
loss grew before the first non-finite step; and a model that calls
``F.scaled_dot_product_attention`` (counted by a wrapper the test puts around it) is never
told to use it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import ampdiag
from ampdiag import schema
from ampdiag.analysis import analyze
from ampdiag.render.plot import session_charts
from ampdiag.session import Session, dumps
from tests.advice_scan import contradictions
from tests.scenarios.harness import Scenario, all_scenarios, score

#: What a finding says when it rules the precision out.
NOT_PRECISION = ("not the precision", "not caused by the precision", "in FP32 too")
#: What tells a user to move to SDPA.
USE_SDPA = ("F.scaled_dot_product_attention instead", "use F.scaled_dot_product_attention")

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
    with sdpa_calls() as calls:
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
    assert must_hold(session, calls[0]) == [], scenario.name
    doc = session.to_dict()
    assert schema.check(doc["derived"], schema.DerivedSection, "derived", strict=True) == []
    # the reloaded session is the live one (a trace's session is saved here: it has no folder)
    reloaded = ampdiag.load(session.path or session.save(tmp_path / "saved"))
    assert [s.get("loss") for s in reloaded.steps] == pytest.approx(
        [s.get("loss") for s in session.steps], nan_ok=True
    )
    assert _state(reloaded) == _state(session)


@contextmanager
def sdpa_calls() -> Iterator[list[int]]:
    """Counts the run's ``F.scaled_dot_product_attention`` calls (a wrapper, then restored)."""
    calls = [0]
    original = torch.nn.functional.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted
    try:
        yield calls
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _texts(session: Session) -> list[tuple[str, str]]:
    return [
        (f.id, " ".join([f.title, f.fix, str(f.evidence.get("why") or "")]))
        for f in session.all_findings()
    ]


def must_hold(session: Session, sdpa: int) -> list[str]:
    """The must-holds this run breaks, each with the finding that breaks it."""
    broken = []
    replay = session.sections.get("sentinel", {}).get("replay") or {}
    fp32 = (replay.get("results") or {}).get("fp32") or {}
    run = session.sections.get("run") or {}
    low_autocast = any(not str(k).endswith("float32") for k in run.get("autocast_seen") or {})
    low_weights = any(
        d in ("float16", "bfloat16") for m in run.get("models") or [] for d in m["param_dtypes"]
    )
    history = session.sections.get("sentinel", {}).get("loss_history") or []
    finite = [v for _, v in history if isinstance(v, float) and math.isfinite(v)]
    grew = len(finite) >= 2 and finite[-1] > 2 * abs(finite[0])
    measured = fp32.get("finite") is False or not (low_autocast or low_weights) or grew
    for fid, text in _texts(session):
        if any(p in text for p in NOT_PRECISION) and not measured:
            broken.append(f"{fid} rules the precision out with no FP32 replay non-finite: {text}")
        if sdpa and any(p in text for p in USE_SDPA):
            broken.append(f"{fid} tells a model on SDPA ({sdpa} calls) to use it: {text}")
    return broken
