"""The weight-updates section: shown when an optimizer updates BF16/FP16 weights, with the
measured share of updates lost as the section records it; absent otherwise."""

from __future__ import annotations

from ampdiag.render.sections import weights
from ampdiag.session import Session
from tests.analysis.test_low_precision_params import weight_updates


def test_the_section_states_the_lost_share() -> None:
    sec = weight_updates(0.875)
    counts = {"elements": 10_000, "unchanged": 8_750, "unchanged_share": 0.875}
    sec["params"] = [{"name": "fc.weight", "dtype": "bfloat16", "numel": 20_000, **counts}]
    built = weights.build(Session(sections={"weight_updates": sec}))
    assert built is not None
    assert "87.5%" in built.summary and "4 low-precision parameters" in built.summary
    assert "fc.weight" in built.html and "8,750 of 10,000" in built.html


def test_no_section_without_low_precision_weights() -> None:
    sec = weight_updates(None)
    sec["optimizers"][0]["low_precision_params"] = 0
    assert weights.build(Session(sections={"weight_updates": sec})) is None
    assert weights.build(Session()) is None
