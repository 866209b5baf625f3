"""Recommendations from constructed sessions: each fires on its evidence and not without it."""

from __future__ import annotations

import math

import pytest

from ampdiag.analysis import advisors as advice_mod
from ampdiag.analysis import analyze
from ampdiag.analysis.advisors import Advisor, advise
from ampdiag.analysis.advisors.recommendations import THRESHOLDS
from ampdiag.analysis.rules.accumulation import grad_accumulation_broken
from ampdiag.session import Finding, Session
from tests.advice_scan import advised

GiB = 1024**3


def cuda_session(bf16: bool | None, **sections: dict) -> Session:
    env = {"device_type": "cuda", "autocast": "cuda:float16", "device_name": "GPU"}
    if bf16 is not None:
        env["bf16_supported"] = bf16
    return Session(environment=env, sections=dict(sections))


def fp16_findings() -> list[Finding]:
    return [
        Finding(
            "fp16-grad-underflow",
            "medium",
            "42% of gradient values underflow in FP16.",
            {"underflow_fraction": 0.42, "recommended_init_scale": 5000.0},
            section="numerics",
            impact=0.5,
        ),
        Finding("grad-scaler-missing", "high", "No GradScaler.", {}, section="numerics"),
        Finding("skipped-steps", "medium", "2 skipped.", {"skipped": 2, "steps": 100}, impact=0.2),
        Finding(
            "loss-scale-collapse",
            "medium",
            "Scale fell.",
            {"scale_initial": 65536.0, "scale_min": 16384.0},
        ),
    ]


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


def one(findings: list[Finding], fid: str) -> Finding:
    found = [f for f in findings if f.id == fid]
    assert len(found) == 1, ids(findings)
    return found[0]


# --- prefer-bf16 / tune-grad-scaler ----------------------------------------------------------


def test_prefer_bf16_merges_the_fp16_symptoms_on_a_bf16_device() -> None:
    other = Finding("dataloader-bound-x", "low", "unrelated")
    out = advise(cuda_session(True), [*fp16_findings(), other])
    rec = one(out, "prefer-bf16")
    merged = ["fp16-grad-underflow", "grad-scaler-missing", "skipped-steps", "loss-scale-collapse"]
    assert rec.evidence["explains"] == merged
    assert [m["id"] for m in rec.evidence["merged"]] == merged
    # The merged findings are cited, not listed twice; the unrelated one stays.
    assert not set(merged) & set(ids(out))
    assert "dataloader-bound-x" in ids(out)
    # Worst severity of what it explains; its numbers are the measured ones.
    assert rec.severity == "high"
    assert rec.evidence["underflow_fraction"] == 0.42
    assert rec.evidence["scale_min"] == 16384.0
    assert "torch.bfloat16" in rec.fix and "GradScaler" in rec.fix
    assert "tune-grad-scaler" not in ids(out)
    assert out[0].id == "prefer-bf16"  # ranked first: high severity


def test_no_precision_advice_without_fp16_evidence() -> None:
    info = Finding("skipped-steps", "info", "1 skip at start (normal).", {"skipped": 1})
    for session in (cuda_session(True), cuda_session(False)):
        out = advise(session, [info, Finding("profiler-no-steps", "info", "x")])
        assert "prefer-bf16" not in ids(out)
        assert "tune-grad-scaler" not in ids(out)
        assert "skipped-steps" in ids(out)


def test_grad_scaler_settings_from_underflow_without_bf16() -> None:
    out = advise(cuda_session(False), fp16_findings())
    rec = one(out, "tune-grad-scaler")
    ev = rec.evidence
    # Underflow needs >= 5000 -> 2^13; overflow began above scale_min 16384: no conflict.
    assert ev["init_scale"] == 8192.0
    # 2 skips = log2(65536 / 16384) start-up backoffs, no steady overflow -> faster growth.
    assert ev["startup_skips"] == 2
    assert ev["growth_interval"] == THRESHOLDS.growth_interval_underflow
    assert "range_conflict" not in ev
    assert "init_scale=8192, growth_interval=500" in rec.fix
    assert "GradScaler('cuda'" in rec.fix
    assert "prefer-bf16" not in ids(out)
    assert set(ev["explains"]) == {f.id for f in fp16_findings()}


def test_grad_scaler_settings_conflict_and_steady_skips() -> None:
    findings = fp16_findings()
    findings[0].evidence["recommended_init_scale"] = 1e5  # needs 2^17 > 16384 allows
    findings[2].evidence.update(skipped=30, steps=100)  # 28 beyond the 2 start-up skips
    rec = one(advise(cuda_session(False), findings), "tune-grad-scaler")
    ev = rec.evidence
    assert ev["range_conflict"] is True
    assert ev["init_scale"] == 16384.0
    assert ev["steady_skip_rate"] == 0.28
    assert ev["growth_interval"] == math.ceil(1 / THRESHOLDS.target_skip_rate)
    assert "FP32" in rec.fix


def test_unknown_bf16_support_gives_scaler_settings_with_a_bf16_note() -> None:
    rec = one(advise(cuda_session(None), fp16_findings()[:2]), "tune-grad-scaler")
    assert rec.evidence["bf16_supported"] is None
    assert "capability >= 8.0" in rec.fix
    # Capability from the environment decides when bf16_supported is absent.
    s = cuda_session(None)
    s.environment["device_capability"] = "8.0"
    assert "prefer-bf16" in ids(advise(s, fp16_findings()[:2]))


def test_forward_overflow_alone_is_not_a_scaler_problem() -> None:
    overflow = Finding("activation-overflow", "high", "x", {"module": "l1", "max_abs": 7e4})
    out = advise(cuda_session(False), [overflow])
    assert ids(out) == ["activation-overflow"]
    out = advise(cuda_session(True), [overflow])
    assert one(out, "prefer-bf16").evidence["max_abs"] == 7e4


def test_cpu_without_native_bf16_is_told_so() -> None:
    s = Session(
        environment={
            "device_type": "cpu",
            "autocast": "cpu:float16",
            "bf16_supported": True,
            "bf16_native": False,
        }
    )
    rec = one(advise(s, fp16_findings()), "prefer-bf16")
    assert rec.evidence["bf16_native"] is False
    assert "emulated" in rec.fix


# --- use-grad-accumulation -------------------------------------------------------------------


def near_capacity(act: float, peak: float = 9.5 * GiB, cap: float = 10 * GiB) -> Finding:
    return Finding(
        "memory-near-capacity",
        "high",
        "Peak at 95% of capacity.",
        {
            "peak_bytes": int(peak),
            "capacity_bytes": int(cap),
            "activation_bytes": int(act),
            "model_state_bytes": int(peak - act),
        },
        section="memory",
        impact=0.5,
    )


def test_grad_accumulation_when_activations_dominate() -> None:
    session = Session(sections={"speed_probe": {"batch_size": 32}})
    out = advise(session, [near_capacity(6 * GiB)])
    rec = one(out, "use-grad-accumulation")
    ev = rec.evidence
    # Target 85% of 10 GiB = 8.5 GiB; 3.5 GiB is not activations -> 5 GiB for activations:
    # ceil(6 / 5) = 2 steps of 16.
    assert (ev["micro_batch"], ev["accumulation_steps"]) == (16, 2)
    assert ev["expected_peak_bytes"] == int(3.5 * GiB + 3 * GiB)
    assert ev["expected_peak_bytes"] <= ev["target_peak_bytes"]
    assert ev["explains"] == ["memory-near-capacity"]
    assert "memory-near-capacity" not in ids(out)
    assert rec.severity == "high"
    assert "accum = 2" in rec.fix and "batch_size=16" in rec.fix


def test_no_grad_accumulation_when_activations_do_not_dominate() -> None:
    out = advise(Session(), [near_capacity(2 * GiB)])
    assert ids(out) == ["memory-near-capacity"]
    # Model state alone above the target: accumulation cannot help either.
    out = advise(Session(), [near_capacity(5 * GiB, peak=14 * GiB, cap=15 * GiB)])
    assert "use-grad-accumulation" not in ids(out)
    assert "use-grad-accumulation" not in ids(advise(Session(), []))


def test_an_existing_grad_accumulation_finding_absorbs_near_capacity() -> None:
    uga = Finding("use-grad-accumulation", "medium", "x", {"micro_batch": 8})
    out = advise(Session(), [near_capacity(6 * GiB), uga])
    assert ids(out) == ["use-grad-accumulation"]
    assert out[0].evidence["micro_batch"] == 8
    assert out[0].evidence["explains"] == ["memory-near-capacity"]
    assert out[0].severity == "high"


# --- tune-input-pipeline / increase-batch-size ------------------------------------------------


def profiled_session(data_us: float, total_us: float) -> Session:
    breakdown = {
        "steps": [{"step": n, "data_us": data_us, "total_us": total_us} for n in range(3)],
        "share": {"data": data_us / total_us, "forward": 1 - data_us / total_us},
        "mean": {"data_us": data_us, "total_us": total_us},
    }
    return Session(
        environment={"device_type": "cuda"},
        sections={"profiler": {"breakdown": breakdown, "trace_files": ["t.json"]}},
    )


def test_input_pipeline_from_the_measured_data_share_through_analyze() -> None:
    # 75 ms of 100 ms waiting for data: 3 workers keep up with 25 ms of compute, plus one.
    out = analyze(profiled_session(75_000, 100_000))
    rec = one(out, "tune-input-pipeline")
    assert rec.evidence["num_workers"] == 4
    assert rec.evidence["pin_memory"] is True
    assert rec.evidence["explains"] == ["dataloader-bound"]
    assert rec.evidence["expected_step_ms"] == 25.0
    assert "num_workers=4, pin_memory=True" in rec.fix
    assert "dataloader-bound" not in ids(out)
    assert rec.severity == "high"  # data share 75% >= the rule's 30% high threshold


def test_no_input_pipeline_advice_below_the_data_threshold() -> None:
    out = analyze(profiled_session(5_000, 100_000))
    assert "tune-input-pipeline" not in ids(out)
    assert "dataloader-bound" not in ids(out)


def test_no_input_pipeline_advice_from_an_uncertain_data_share() -> None:
    # per-step shares 5%, 12%, 30%: median 12%, but the interval (5%-19%) straddles 10%
    session = profiled_session(12_000, 100_000)
    rows = session.sections["profiler"]["breakdown"]["steps"]
    rows[0]["data_us"], rows[2]["data_us"] = 5_000, 30_000
    out = analyze(session)
    assert "tune-input-pipeline" not in ids(out)
    (dl,) = [f for f in out if f.id == "dataloader-bound"]
    assert dl.severity == "info" and "straddle" in dl.evidence["uncertain"]


def test_gpu_idle_merges_into_the_data_advice() -> None:
    dl = Finding("dataloader-bound", "medium", "x", {"data_share": 0.2})
    idle = Finding("gpu-idle", "high", "x", {"idle_share": 0.3})
    out = advise(Session(environment={"device_type": "cuda"}), [dl, idle])
    rec = one(out, "tune-input-pipeline")
    assert rec.evidence["explains"] == ["dataloader-bound", "gpu-idle"]
    assert rec.evidence["num_workers"] == 2
    assert rec.severity == "high"


def test_increase_batch_size_from_idle_share() -> None:
    idle = Finding("gpu-idle", "medium", "x", {"idle_share": 0.3}, impact=0.3)
    launch = Finding("launch-bound", "low", "x", {})
    session = Session(sections={"speed_probe": {"batch_size": 16}})
    rec = one(advise(session, [idle, launch]), "increase-batch-size")
    k = rec.evidence["batch_multiplier"]
    assert k == 4
    # The formula's promise, checked directly: idle s/(s+(1-s)k) reaches the 10% target.
    assert 0.3 / (0.3 + 0.7 * k) <= THRESHOLDS.target_idle_share
    assert 0.3 / (0.3 + 0.7 * (k - 1)) > THRESHOLDS.target_idle_share
    assert rec.evidence["suggested_batch_size"] == 64
    assert rec.evidence["explains"] == ["gpu-idle", "launch-bound"]


def test_no_batch_advice_when_memory_is_full_or_idle_is_small() -> None:
    idle = Finding("gpu-idle", "medium", "x", {"idle_share": 0.3})
    out = advise(Session(), [idle, near_capacity(2 * GiB)])
    assert "increase-batch-size" not in ids(out) and "gpu-idle" in ids(out)
    small = Finding("gpu-idle", "low", "x", {"idle_share": 0.05})
    assert ids(advise(Session(), [small])) == ["gpu-idle"]


# --- the mechanism ---------------------------------------------------------------------------


def test_a_failing_advisor_keeps_the_findings_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(session: Session, findings: list[Finding]):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    advice_mod.advisors()  # import the real ones first
    monkeypatch.setattr(advice_mod, "advisors", lambda: [Advisor(("x",), broken, "")])
    out = advise(Session(), fp16_findings())
    assert "analysis-error" in ids(out)
    assert {f.id for f in fp16_findings()} <= set(ids(out))


def test_merged_recommendation_round_trips_through_session_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ampdiag.session import load

    s = cuda_session(True)
    s.findings = advise(s, fp16_findings())
    s.save(tmp_path)
    back = load(tmp_path)
    rec = one(back.findings, "prefer-bf16")
    assert rec.evidence["merged"][0]["evidence"]["underflow_fraction"] == 0.42


def test_grad_accumulation_reads_the_batch_the_memory_collector_observed() -> None:
    # The memory collector writes `observed_batch`; with no speed probe it is the only source
    # of the batch size (the rule read `memory.batch_size`, a key nothing writes).
    session = Session(sections={"memory": {"observed_batch": 32}})
    rec = one(advise(session, [near_capacity(6 * GiB)]), "use-grad-accumulation")
    assert (rec.evidence["micro_batch"], rec.evidence["accumulation_steps"]) == (16, 2)
    assert "batch_size=16" in rec.fix


@pytest.mark.parametrize(
    ("autocast", "precisions"),
    [("cuda:float16", {"fp16"}), ("cuda:bfloat16", {"bf16"}), (None, set())],
)
def test_grad_accumulation_fix_keeps_the_runs_precision(
    autocast: str | None, precisions: set[str]
) -> None:
    """The fix changes the batch, never the precision (read as the user reads it)."""
    session = Session(
        environment={"autocast": autocast} if autocast else {},
        sections={"speed_probe": {"batch_size": 32}},
    )
    rec = one(advise(session, [near_capacity(6 * GiB)]), "use-grad-accumulation")
    assert advised(rec.fix) == precisions
    compile(rec.fix, "<fix>", "exec")
    assert ("scaler.scale(loss).backward()" in rec.fix) == (precisions == {"fp16"})


@pytest.mark.parametrize(
    ("autocast", "precisions"),
    [("cpu:float16", {"fp16"}), ("cuda:bfloat16", {"bf16"}), (None, set())],
)
def test_broken_accumulation_fix_keeps_the_runs_precision(
    autocast: str | None, precisions: set[str]
) -> None:
    """Fixing where gradients are reset must not take the run's autocast or scaler away."""
    step = {"step": 3, "micro_batches": 4, "forwards": 4, "zeroed_before": [2], "how": "zero"}
    session = Session(
        environment={"autocast": autocast} if autocast else {},
        sections={"accumulation": {"steps": [step]}},
    )
    (rec,) = grad_accumulation_broken(session)
    assert advised(rec.fix) == precisions
    compile(rec.fix, "<fix>", "exec")
    assert ("scaler.scale(loss).backward()" in rec.fix) == (precisions == {"fp16"})
    code = [line for line in rec.fix.splitlines() if not line.lstrip().startswith("#")]
    assert "accum = 4" in code and sum("zero_grad(" in line for line in code) == 2
