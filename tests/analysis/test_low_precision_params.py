"""low-precision-params from the weight_updates section: severity from the measured share, one
precision advice with the A/B, a fix the device runs, silence where a master copy exists.

The sections are written here (the collector's own tests count the shares against the loop);
what is checked is what the user reads: the advised precision read from the fix's code by
`tests.advice_scan`, and the devices the code names.
"""

from __future__ import annotations

from typing import Any

from ampdiag.analysis import analyze
from ampdiag.session import Finding, Session
from tests.advice_scan import advised, contradictions


def weight_updates(share: float | None, masters: int = 0) -> dict[str, Any]:
    elements = 10_000
    return {
        "optimizers": [
            {
                "optimizer": "AdamW",
                "params": 4,
                "low_precision_in_optimizer": 4,
                "low_precision_params": 4,
                "low_precision_numel": 20_000,
                "dtypes": {"bfloat16": 4},
                "examples": ["fc.weight"],
                "lr": [1e-4],
                "master_params": masters,
            }
        ],
        "steps": []
        if share is None
        else [
            {
                "step": 0,
                "optimizer": "AdamW",
                "params": 4,
                "elements": elements,
                "unchanged": round(share * elements),
                "unchanged_share": share,
            }
        ],
        "steps_measured": 0 if share is None else 1,
        "elements": 0 if share is None else elements,
        "unchanged": 0 if share is None else round(share * elements),
        "unchanged_share": share,
        "params": [],
    }


def ab_fp32_fastest() -> dict[str, Any]:
    """A precision A/B that timed FP32 clearly faster than BF16, both safe."""

    def row(p: str, t: float) -> dict[str, Any]:
        timed = {"time_ms": t, "time_spread_ms": 0.05, "samples": 5}
        safe = {"loss_rel_diff": 0.0, "grad_underflow": 0.0, "grad_sqnr_db_median": 40.0}
        return {"precision": p, **timed, **safe}

    return {
        "autocast": "cpu:bfloat16",
        "precisions": {"results": [row("fp32", 1.0), row("bf16", 3.0)]},
    }


def findings(sections: dict[str, Any], **env: Any) -> dict[str, Finding]:
    session = Session(sections=sections)
    session.environment.update({"device_type": "cpu", "autocast": "cpu:bfloat16", **env})
    session.findings = analyze(session)
    return {f.id: f for f in session.all_findings()}


def test_severity_follows_the_measured_share() -> None:
    got = {
        share: findings({"weight_updates": weight_updates(share)})["low-precision-params"].severity
        for share in (0.9, 0.1, 0.01)
    }
    assert got == {0.9: "high", 0.1: "medium", 0.01: "low"}
    unmeasured = findings({"weight_updates": weight_updates(None)})["low-precision-params"]
    assert unmeasured.severity == "medium" and "not measured" in unmeasured.title


def test_the_fix_computes_in_a_precision_the_device_runs() -> None:
    cpu = findings({"weight_updates": weight_updates(0.9)})["low-precision-params"].fix or ""
    assert advised(cpu) == {"bf16"} and "device_type='cpu'" in cpu
    volta = (
        findings(
            {"weight_updates": weight_updates(0.9)},
            device_type="cuda",
            device_capability="7.0",
            bf16_supported=True,  # torch says so on a V100: emulated
        )["low-precision-params"].fix
        or ""
    )
    assert advised(volta) == {"fp16"} and "GradScaler('cuda')" in volta
    assert "torch.bfloat16" not in volta


def test_one_precision_advice_with_the_ab() -> None:
    """Where the A/B measured FP32 the fastest safe, the weights' fix trains in FP32 too."""
    found = findings({"weight_updates": weight_updates(0.9), "speed_probe": ab_fp32_fastest()})
    assert advised(found["low-precision-params"].fix or "") == {"fp32"}
    assert "prefer-fp32" in found
    assert contradictions(found.values()) == []


def test_weights_with_master_copies_are_silent() -> None:
    found = findings({"weight_updates": weight_updates(None, masters=4)})
    assert "low-precision-params" not in found


def test_an_older_session_without_the_section_still_names_fp16_parameters() -> None:
    scaler = {"fp16_params": [{"optimizer": "SGD", "fp16_params": 3, "fp16_numel": 300,
                               "params": 3, "examples": ["w"]}]}  # fmt: skip
    f = findings({"scaler": scaler})["low-precision-params"]
    assert f.evidence["low_precision_params"] == 3 and f.evidence["dtypes"] == {"float16": 3}
    # nothing measured, on a CPU that runs BF16 (the run autocasts to it): BF16, as prefer-bf16
    assert advised(f.fix or "") == {"bf16"}
