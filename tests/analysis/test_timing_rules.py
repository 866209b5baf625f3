"""Timing figures with their spread (`ampdiag.timing`) and the step-time rule that reads them.

Constructed samples only: what is checked is the arithmetic and the decisions (the median, the
interval, which side of a threshold it falls on), never a measured time.
"""

from __future__ import annotations

import math

import pytest

from ampdiag import timing
from ampdiag.analysis import analyze
from ampdiag.session import Finding, Session


def test_median_and_mad_shrug_off_one_stalled_sample() -> None:
    calm = timing.estimate([10.0, 11.0, 12.0])
    stalled = timing.estimate([10.0, 11.0, 500.0])
    assert (calm.median, calm.low, calm.high, calm.samples) == (11.0, 10.0, 12.0, 3)
    assert (stalled.median, stalled.spread) == (calm.median, calm.spread)


def test_versus_compares_the_whole_interval() -> None:
    est = timing.estimate([0.9, 1.0, 1.1])
    assert est.versus(0.8) == "above"
    assert est.versus(1.2) == "below"
    assert est.versus(1.05) == "uncertain"
    assert timing.estimate([5.0]).versus(1.0) == "uncertain"  # one sample: no interval


def test_quotient_interval_and_tightness() -> None:
    r = timing.quotient(timing.estimate([30.0, 33.0, 36.0]), timing.estimate([9.0, 10.0, 11.0]))
    assert r.median == pytest.approx(3.3)
    assert (r.low, r.high) == (pytest.approx(30 / 11), pytest.approx(36 / 9))
    assert math.isinf(
        timing.quotient(timing.estimate([1.0]), timing.estimate([1.0, 0.0, 2.0])).high
    )
    assert timing.tight(timing.estimate([100.0, 101.0, 99.0]), 0.05)
    assert not timing.tight(timing.estimate([100.0, 101.0]), 0.05)  # too few to call tight
    assert not timing.tight(timing.estimate([151.0, 24.0, 101.0]), 0.05)


def data_session(shares: list[float], step_us: float = 100_000.0) -> Session:
    rows = [{"step": i, "data_us": s * step_us, "total_us": step_us} for i, s in enumerate(shares)]
    mean = sum(shares) / len(shares)
    return Session(
        environment={"device_type": "cpu"},
        sections={
            "profiler": {
                "trace_files": ["t.json"],
                "breakdown": {
                    "steps": rows,
                    "share": {"data": mean},
                    "mean": {"data_us": mean * step_us, "total_us": step_us},
                },
            }
        },
    )


def data_findings(shares: list[float]) -> list[Finding]:
    found = analyze(data_session(shares))
    return [f for f in found if f.id in ("dataloader-bound", "tune-input-pipeline")]


def test_one_stalled_step_among_three_drives_no_share() -> None:
    # HF BERT: one stalled step among three made the mean share 10.1%
    assert not data_findings([0.01, 0.012, 0.28])
    assert not data_findings([0.01, 0.9, 0.012])


def test_a_data_bound_run_is_a_claim_whose_severity_is_the_lower_end() -> None:
    (rec,) = data_findings([0.5, 0.52, 0.48])
    assert rec.id == "tune-input-pipeline" and rec.severity == "high"
    assert rec.evidence["explains"] == ["dataloader-bound"]
    (medium,) = data_findings([0.33, 0.25, 0.4])  # median 33%, interval 26%-40%
    assert medium.severity == "medium"
    # one fast (prefetched) step among three does not silence it either
    (still,) = data_findings([0.5, 0.01, 0.5])
    assert still.severity == "high"


def test_a_share_that_straddles_the_threshold_is_uncertain() -> None:
    (dl,) = data_findings([0.05, 0.12, 0.2])
    assert dl.id == "dataloader-bound" and dl.severity == "info"
    assert dl.evidence["data_share_low"] < 0.1 < dl.evidence["data_share_high"]
    (single,) = data_findings([0.5])
    assert single.severity == "info" and "single" in single.evidence["uncertain"]


def test_a_single_step_that_waits_for_nothing_is_no_finding() -> None:
    # "Data loading may take 0% of a step" told a person nothing (every trace of one step)
    assert not data_findings([0.0])
    assert not data_findings([0.03])
    (some,) = data_findings([0.08])
    assert some.severity == "info"


def test_a_step_with_no_data_loading_says_nothing_about_it() -> None:
    # the DeepSeek-V3 trace's one ProfilerStep has no DataLoader span: "may take 0%" is no claim
    assert data_findings([0.0]) == []
    assert data_findings([0.0, 0.0, 0.0]) == []
