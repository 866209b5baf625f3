"""Fix code uses the run's device: a CPU run is never told torch.autocast('cuda', ...).

Truth is the device recorded in the session's environment, set here by the test itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from ampdiag.analysis import analyze
from ampdiag.session import Finding, Session
from tests.analysis.test_numerics_rules import activations_section, run_section, scaler_section


def findings(sections: dict[str, Any], device: str) -> dict[str, Finding]:
    session = Session(sections=sections)
    session.environment["device_type"] = device
    session.findings = analyze(session)
    return {f.id: f for f in session.all_findings()}


def collapse_and_overflow() -> dict[str, Any]:
    scales = [65536.0 / 2**i for i in range(20)]
    return {
        "activations": activations_section({"blocks.0.mlp": 70000.0}),
        "run": run_section("cpu:float16"),
        "scaler": scaler_section(scales),
    }


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fix_code_names_the_runs_device(device: str) -> None:
    f = findings(collapse_and_overflow(), device)
    fixes = {fid: f[fid].fix or "" for fid in ("activation-overflow", "loss-scale-collapse")}
    other = "cuda" if device == "cpu" else "cpu"
    for fid, fix in fixes.items():
        assert f"autocast('{device}'" in fix, (fid, fix)
        assert f"autocast('{other}'" not in fix, (fid, fix)
