"""Numerics rules on constructed sessions: each fires with its evidence, silent without."""

from __future__ import annotations

from typing import Any

import pytest

from ampdiag.analysis import analyze
from ampdiag.analysis.rules.numerics import THRESHOLDS
from ampdiag.session import Finding, Session


def findings(sections: dict[str, Any]) -> dict[str, Finding]:
    session = Session(sections=sections)
    session.findings = analyze(session)
    return {f.id: f for f in session.all_findings()}


def scaler_section(scales: list[float]) -> dict[str, Any]:
    """A scaler history that starts at scales[0] and halves/holds as given (one row a step)."""
    history = []
    for i, s in enumerate(scales):
        after = scales[i + 1] if i + 1 < len(scales) else s
        history.append({"step": i, "scale": s, "skipped": after < s, "scale_after": after})
    return {
        "present": True,
        "scaler": {"class": "GradScaler", "enabled": True, "device": "cpu"},
        "history": history,
        "skipped_steps": [h["step"] for h in history if h["skipped"]],
        "growth_steps": [h["step"] for h in history if h["scale_after"] > h["scale"]],
        "backoff_steps": [h["step"] for h in history if h["scale_after"] < h["scale"]],
    }


def halvings(start: float, n: int) -> list[float]:
    return [start * 0.5**i for i in range(n + 1)]


def test_loss_scale_collapse_below_one_is_high_with_the_scales_as_evidence() -> None:
    scales = halvings(2.0**16, 20)  # 65536 -> 2^-4
    f = findings({"scaler": scaler_section(scales)})["loss-scale-collapse"]
    assert f.severity == "high"
    assert f.evidence["scale_initial"] == 2.0**16
    assert f.evidence["scale_min"] == 2.0**-4
    assert f.evidence["scale_min"] < THRESHOLDS.scale_collapse_abs
    assert f.evidence["backoffs"] == 20
    assert f.evidence["steps"] == 21


def test_loss_scale_collapse_by_ratio_is_medium() -> None:
    # 2^24 -> 2^14: a fall of 2^-10 of the initial value, still above 1.
    f = findings({"scaler": scaler_section(halvings(2.0**24, 10))})["loss-scale-collapse"]
    assert f.severity == "medium"
    assert (f.evidence["scale_initial"], f.evidence["scale_min"]) == (2.0**24, 2.0**14)


@pytest.mark.parametrize(
    "scales",
    [halvings(2.0**24, 9), [65536.0, 65536.0, 131072.0], [65536.0] * 5],
    ids=["fell-2^-9", "grew", "steady"],
)
def test_no_loss_scale_collapse_without_a_collapse(scales: list[float]) -> None:
    assert "loss-scale-collapse" not in findings({"scaler": scaler_section(scales)})


def test_no_loss_scale_collapse_without_a_scaler_history() -> None:
    assert "loss-scale-collapse" not in findings({"scaler": {"present": False, "history": []}})
    assert "loss-scale-collapse" not in findings({})


def activations_section(max_abs: dict[str, float]) -> dict[str, Any]:
    return {
        "sampled_steps": 1,
        "modules": [
            {"module": name, "max_abs": v, "output_dtype": "float16"} for name, v in max_abs.items()
        ],
    }


def run_section(autocast: str) -> dict[str, Any]:
    return {"autocast_seen": {autocast: 3}, "models": [{"param_dtypes": ["float32"]}]}


def test_activation_overflow_in_an_fp16_run_is_high_and_names_the_module() -> None:
    sections = {
        "activations": activations_section({"blocks.0.mlp": 70000.0, "head": 20000.0, "x": 3.0}),
        "run": run_section("cpu:float16"),
    }
    f = findings(sections)["activation-overflow"]
    assert f.severity == "high"
    assert f.evidence["module"] == "blocks.0.mlp"
    assert f.evidence["max_abs"] == 70000.0
    assert f.evidence["fp16_in_use"] is True
    assert f.evidence["modules_near_limit"] == ["blocks.0.mlp", "head"]


@pytest.mark.parametrize("peak", [1e6, THRESHOLDS.activation_near + 1.0])
def test_activation_overflow_in_a_bf16_run_is_an_info_what_if(peak: float) -> None:
    """BF16 holds 1e6: an FP16 overflow is a what-if for switching, never the run's problem."""
    sections = {
        "activations": activations_section({"attn": peak}),
        "run": run_section("cpu:bfloat16"),
    }
    f = findings(sections)["activation-overflow"]
    assert f.severity == "info"
    assert "if this run used FP16" in f.title
    assert (f.evidence["module"], f.evidence["max_abs"]) == ("attn", peak)
    assert f.evidence["fp16_in_use"] is False


def test_activation_within_4x_of_fp16_max_is_low() -> None:
    near = THRESHOLDS.activation_near + 1.0
    sections = {"activations": activations_section({"m": near}), "run": run_section("cpu:float16")}
    f = findings(sections)["activation-overflow"]
    assert f.severity == "low"
    assert f.evidence["max_abs"] == near


def test_no_activation_overflow_in_range_or_unmeasured() -> None:
    in_range = THRESHOLDS.activation_near - 1.0
    sections = {
        "activations": activations_section({"a": in_range, "b": 1.0}),
        "run": run_section("cpu:float16"),
    }
    assert "activation-overflow" not in findings(sections)
    assert "activation-overflow" not in findings({"run": run_section("cpu:float16")})
    # an inf output is the NaN/inf origin's business, not a range finding
    inf_only = {"activations": activations_section({"a": float("inf")})}
    assert "activation-overflow" not in findings(inf_only)


@pytest.mark.parametrize("scale", [2.0**8, 2.0**21, 2.0**40])
@pytest.mark.parametrize("rule", ["grad-scaler-missing", "fp16-grad-underflow"])
def test_the_fix_builds_the_recommended_scale(rule: str, scale: float) -> None:
    """The fix's GradScaler line, run by torch, holds the recommended scale exactly (a scale
    written as 2.09715e+06 builds 2097150, no power of two)."""
    import torch

    from ampdiag.analysis.registry import rules

    underflow = {"underflow_fraction": 0.5, "recommended_init_scale": scale}
    session = Session(
        environment={"device_type": "cpu"},
        sections={
            "run": run_section("cpu:float16") | {"scaler": None},
            "derived": {
                "numerics": {
                    "underflow": underflow | {"measured": True, "scale_reaches_target": True}
                }
            },
        },
    )
    (f,) = next(r for r in rules() if rule in r.ids).func(session)
    (line,) = [x for x in f.fix.splitlines() if x.startswith("scaler = torch.amp.GradScaler(")]
    built: dict[str, Any] = {}
    exec(line, {"torch": torch}, built)
    assert built["scaler"].get_scale() == scale == f.evidence["recommended_init_scale"]
