"""One precision advice, from the A/B when it was measured: constructed sessions.

Each session carries a precision A/B (``speed_probe.precisions``) with known times, spreads
and errors; the advice must name the fastest safe precision (or none when the run's own is
tied with it), cite the measured speed-up and memory, and no two findings may advise
different precisions (`tests.advice_scan`, which reads only the fixes).
"""

from __future__ import annotations

from typing import Any

from ampdiag.analysis import analyze, precision_choice
from ampdiag.analysis.advisors import advise
from ampdiag.analysis.rules.autocast_speed import autocast_slower
from ampdiag.render.console import summary
from ampdiag.session import Finding, Session
from tests.advice_scan import advised, contradictions


def row(p: str, ms: float, spread: float | None, saved: int, **extra: Any) -> dict[str, Any]:
    return {"precision": p, "time_ms": ms, "time_spread_ms": spread, "saved_bytes": saved,
            "samples": 7 if spread is not None else 1, "nonfinite": False,
            "loss_rel_diff": None if p == "fp32" else 1e-4,
            "grad_underflow": None if p == "fp32" else 0.0,
            "grad_sqnr_db_median": None if p == "fp32" else 40.0, **extra}  # fmt: skip


def session(
    autocast: str, rows: list[dict[str, Any]], probe_ratio: float = 1.0, **env: Any
) -> Session:
    device = autocast.split(":")[0]
    environment = {"device_type": device, "autocast": autocast, "bf16_supported": True,
                   "bf16_native": True, **env}  # fmt: skip
    probe = {"autocast": autocast, "skipped": None, "fp32_ms": 10.0,
             "autocast_ms": 10.0 * probe_ratio, "repeats": 5, "measured": "forward + backward",
             "fp32_ms_all": [9.9, 10.0, 10.1, 10.0, 10.05],
             "autocast_ms_all": [probe_ratio * t for t in (9.95, 10.0, 10.05, 10.1, 9.9)],
             "modules": [], "precisions": {"results": rows, "budget_s": 20.0}}  # fmt: skip
    return Session(environment=environment, sections={"speed_probe": probe})


def fp16_trouble() -> list[Finding]:
    return [
        Finding("grad-scaler-missing", "high", "No GradScaler.", {}, section="numerics"),
        Finding(
            "fp16-grad-underflow",
            "medium",
            "30% underflow.",
            {"underflow_fraction": 0.3, "recommended_init_scale": 4096.0},
            fix="use a GradScaler or train in bfloat16",
        ),
    ]


SLOW_CONV = [{"module": "conv1", "fp32_ms": 0.67, "ms": 47.0, "cast_ms": 0.05,
              "kernel_ms": 46.95, "cause": "kernels"}]  # fmt: skip


def test_fp16_on_a_bf16_cpu_gets_one_advice_bf16_with_the_measured_gain() -> None:
    # The case: FP16 ResNet on a CPU with native BF16 got "train in FP32" and
    # "switch to BF16". Measured: BF16 fastest and safe, FP16 50x slower in its kernels.
    rows = [row("fp32", 10.0, 0.4, 1000), row("bf16", 7.0, 0.3, 500),
            row("fp16", 500.0, 20.0, 500, modules=SLOW_CONV)]  # fmt: skip
    s = session("cpu:float16", rows, probe_ratio=50.0)
    out = advise(s, [*autocast_slower(s), *fp16_trouble()])
    assert [f.id for f in out] == ["prefer-bf16"]
    rec = out[0]
    assert rec.severity == "high" and rec.evidence["measured"] is True
    assert set(rec.evidence["explains"]) == {"autocast-slower", "grad-scaler-missing",
                                             "fp16-grad-underflow"}  # fmt: skip
    assert rec.evidence["speedup_vs_run"]["median"] == round(500 / 7, 3)
    assert rec.evidence["speedup_vs_run"]["low"] == round(480 / 7.3, 3)
    assert rec.evidence["activation_saving_vs_run"] == 0.0  # same bytes as FP16
    assert advised(rec.fix) == {"bf16"}
    # the merged autocast-slower names its measured cause per module, and advises BF16 too
    slower = next(m for m in rec.evidence["merged"] if m["id"] == "autocast-slower")
    assert slower["evidence"]["cause"] == "kernels"
    assert slower["evidence"]["module_causes"] == {"conv1": "kernels"}
    assert "kernels themselves are slower" in slower["title"]
    assert advised(slower["fix"]) == {"bf16"}
    assert contradictions(out) == []


def test_a_bf16_run_tied_with_fp32_is_told_nothing_and_the_probe_is_uncertain() -> None:
    rows = [row("fp32", 10.0, 1.0, 1000), row("bf16", 10.5, 1.0, 500),
            row("fp16", 500.0, 20.0, 500)]  # fmt: skip
    s = session("cpu:bfloat16", rows, probe_ratio=1.3)
    out = analyze(s)
    assert not [f for f in out if f.id.startswith("prefer-") or f.id == "tune-grad-scaler"]
    (slower,) = [f for f in out if f.id == "autocast-slower"]
    # one number: the A/B's ratio (10.5 / 10.0 ms), tied within its spread, not the probe's 1.3x
    assert slower.severity == "info" and "precision A/B" in slower.evidence["measured"]
    assert slower.evidence["slowdown"] == 1.05 and "1.30x" not in slower.title
    assert advised(slower.fix) == set()


def test_a_bf16_run_measured_slower_than_fp32_is_told_fp32() -> None:
    # A CPU without native BF16: BF16 emulated, 2x FP32's time; no prefer-bf16 for a BF16 run
    rows = [row("fp32", 10.0, 0.5, 1000), row("bf16", 20.0, 0.5, 500),
            row("fp16", 600.0, 20.0, 500)]  # fmt: skip
    s = session("cpu:bfloat16", rows, probe_ratio=2.0, bf16_native=False)
    out = analyze(s)
    ids = [f.id for f in out]
    assert "prefer-fp32" in ids and "prefer-bf16" not in ids and "autocast-slower" not in ids
    rec = next(f for f in out if f.id == "prefer-fp32")
    assert rec.severity == "medium"  # a speed claim, the merged autocast-slower (2x) too
    assert rec.evidence["speedup_vs_run"]["median"] == 2.0
    assert rec.evidence["activation_saving_vs_run"] == -1.0  # FP32 keeps twice the bytes
    assert "100% more activation memory" in rec.title
    assert advised(rec.fix) == {"fp32"}
    assert contradictions(out) == []


def test_fp32_advice_for_an_unsafe_bf16_run_does_not_contradict_itself() -> None:
    # run_clm_no_trainer's loop (Accelerate, bf16 on the CPU): BF16 slower and 1.1% off FP32's
    # loss. The title said "BF16 is not numerically safe here (...), numerically safe."
    rows = [row("fp32", 10.0, 0.5, 1000), row("bf16", 16.0, 0.5, 500, loss_rel_diff=0.011)]
    rec = next(f for f in analyze(session("cpu:bfloat16", rows)) if f.id == "prefer-fp32")
    assert "BF16 is not numerically safe here (loss 1.1% off FP32's)" in rec.title
    assert rec.title.count("numerically safe") == 1
    assert rec.title.endswith(".") and ",." not in rec.title


def test_bf16_advice_says_bf16_passed_the_numerics_check() -> None:
    rows = [row("fp32", 20.0, 0.5, 1000), row("bf16", 10.0, 0.5, 500)]
    rec = next(f for f in analyze(session("cpu:float16", rows)) if f.id == "prefer-bf16")
    assert "BF16 is numerically safe here" in rec.title


def test_fp16_alone_fastest_keeps_fp16_and_tunes_the_scaler() -> None:
    rows = [row("fp32", 10.0, 0.2, 1000), row("bf16", 8.0, 0.2, 500),
            row("fp16", 5.0, 0.2, 500)]  # fmt: skip
    s = session("cuda:float16", rows)
    out = advise(s, fp16_trouble())
    assert [f.id for f in out] == ["tune-grad-scaler"]
    assert out[0].evidence["measured"] is True and out[0].evidence["precision"] == "fp16"
    # the A/B's times are evidence, not comments in the fix's code
    assert "FP32 2.00x its time, BF16 1.60x its time" in out[0].evidence["compared"]
    assert "its time" not in out[0].fix
    assert contradictions(out) == []


def test_untimed_ab_falls_back_to_the_rules_and_says_so() -> None:
    rows = [row("fp32", 10.0, None, 1000), row("bf16", 7.0, None, 500),
            row("fp16", 500.0, None, 500)]  # fmt: skip
    s = session("cpu:float16", rows, probe_ratio=50.0)
    out = advise(s, [*autocast_slower(s), *fp16_trouble()])
    rec = next(f for f in out if f.id == "prefer-bf16")
    assert rec.evidence["measured"] is False
    # why it was not measured is evidence, never a comment pasted into the fix's code
    assert "timed once" in rec.evidence["not_measured"] and "timed once" not in rec.fix
    # autocast-slower advises the same BF16 step: merged into the one recommendation, whose
    # console shows that code once (it was printed twice, under two high findings)
    assert [f.id for f in out] == ["prefer-bf16"]
    slower = next(m for m in rec.evidence["merged"] if m["id"] == "autocast-slower")
    assert "Not measured by the precision A/B" in slower["fix"]
    assert advised(rec.fix) == {"bf16"} and "bf16" in advised(slower["fix"])
    assert contradictions(out) == []
    printed = summary(Session(environment=s.environment, findings=out))
    assert printed.count("with torch.autocast(device_type='cpu', dtype=torch.bfloat16):") == 1


def test_probe_slowdown_alone_is_one_recommendation_with_its_code_once() -> None:
    # The CPU demo's case: FP16 measured 8.5x slower by the probe, the A/B over its budget.
    s = session("cpu:float16", [], probe_ratio=8.5)
    s.section("speed_probe")["precisions"] = {"skipped": "over its budget"}
    out = advise(s, list(autocast_slower(s)))
    assert [f.id for f in out] == ["prefer-bf16"] and out[0].severity == "medium"
    assert out[0].evidence["explains"] == ["autocast-slower"]
    printed = summary(Session(environment=s.environment, findings=out))
    assert printed.count("loss.backward()") == 1, printed


def test_no_ab_at_all_a_trace_says_the_advice_was_not_measured() -> None:
    s = Session(environment={"device_type": "cuda", "autocast": "cuda:float16",
                             "bf16_supported": True})  # fmt: skip
    (rec,) = advise(s, fp16_trouble())
    assert rec.id == "prefer-bf16" and rec.evidence["measured"] is False
    assert "no speed probe ran" in rec.evidence["not_measured"]


def test_the_choice_keeps_the_precision_in_use_unless_a_safe_one_is_clearly_faster() -> None:
    unsafe_bf16 = row("bf16", 5.0, 0.1, 500, loss_rel_diff=0.05)
    choice = precision_choice.choose([row("fp32", 10.0, 0.1, 1000), unsafe_bf16])
    assert choice is not None and choice.precision == "fp32" and not choice.uncertain
    assert choice.unsafe == {"bf16": ["loss 5.0% off FP32's"]}
    low_sqnr = row("bf16", 5.0, 0.1, 500, grad_sqnr_db_median=12.0)
    assert precision_choice.is_safe(low_sqnr) is False
    # BF16 a little slower (10.5 ms against 10.0 ms): never chosen as a "tie", whatever it saves
    tied = precision_choice.choose([row("fp32", 10.0, 1.0, 1000), row("bf16", 10.5, 1.0, 500)])
    assert tied is not None and tied.precision == "fp32" and tied.tied == ["fp32", "bf16"]
    assert "none was measured at least 1.10x faster" in precision_choice.tie_break(tied)
    # the run's own BF16 measured 0.93x as fast as FP32 (0.88x-0.99x, run_clm's case): kept,
    # not called a tie and not switched for a gain under the 1.10x a switch must clear
    rows = [row("fp32", 10.0, 0.3, 1000), row("bf16", 10.75, 0.3, 500)]
    kept = precision_choice.choose(rows, keep="bf16")
    assert kept is not None and kept.precision == "bf16"
    # two clearly faster ones that cannot be told apart: the one that keeps less memory
    both = [row("fp32", 20.0, 0.2, 1000), row("bf16", 10.2, 0.5, 500), row("fp16", 10.0, 0.5, 600)]
    pick = precision_choice.choose(both)
    assert pick is not None and pick.precision == "bf16" and pick.tied == ["bf16", "fp16"]
    assert "least activation memory" in precision_choice.tie_break(pick)
    same = precision_choice.choose([row("fp32", 10.0, 1.0, 1000), row("tf32", 9.8, 1.0, 1000)])
    assert same is not None and same.precision == "fp32" and same.uncertain
    once = precision_choice.choose([row("fp32", 10.0, None, 1000), row("bf16", 5.0, None, 500)])
    assert once is not None and once.precision == "fp32" and not once.timed


def test_autocast_slower_blames_the_casts_when_they_take_the_extra_time() -> None:
    casts = [{"module": "fc", "fp32_ms": 0.10, "ms": 0.30, "cast_ms": 0.18, "kernel_ms": 0.12,
              "cause": "casts"}]  # fmt: skip
    rows = [row("fp32", 10.0, 0.2, 1000), row("bf16", 13.0, 0.2, 500, modules=casts),
            row("fp16", 600.0, 20.0, 500)]  # fmt: skip
    s = session("cpu:bfloat16", rows, probe_ratio=1.3)
    (f,) = autocast_slower(s)
    assert f.evidence["cause"] == "casts" and f.evidence["cast_ms"] == 0.18
    assert "the casts cost more" in f.title
    assert advised(f.fix) == {"fp32"}


def test_low_precision_inactive_advises_the_runs_own_dtype() -> None:
    # a BF16 CUDA run whose matmuls ran in FP32 is told to run them in BF16, not FP16
    mm = {"phase": "forward", "module": "fc", "op": "mm", "autocast": True, "precision": "fp32",
          "reason": "promotion", "cast_origin": None, "count": 1, "flops": 1000,
          "time_us": 5.0, "cast_bytes": 0}  # fmt: skip
    s = Session(
        environment={"device_type": "cuda", "autocast": "cuda:bfloat16"},
        sections={
            "precision": {
                "audited": True,
                "step": 1,
                "device_type": "cuda",
                "ops": [mm],
                "autocast_dtypes": {"cuda": "bfloat16"},
            }
        },
    )
    (f,) = [f for f in analyze(s) if f.id == "low-precision-inactive"]
    assert advised(f.fix) == {"bf16"}
    amp_off = Session(sections={"precision": {"audited": True, "step": 1, "device_type": "cpu",
                                              "ops": [mm | {"autocast": False}]}})  # fmt: skip
    (off,) = [f for f in analyze(amp_off) if f.id == "amp-off"]
    assert off.evidence["measured"] is False and "ampdiag.compare" in off.fix


def test_a_precision_the_ab_did_not_time_gets_no_measured_claim() -> None:
    # A BF16 run on a CPU: FP16's observed pass predicted an overrun of the A/B's budget, so it
    # was not timed (its numerics are). The advice compares only the timed precisions and
    # says FP16 was not timed, and why, without a time for it.
    why = "not timed: its observed pass took 600 ms, ... would overrun the A/B's budget of 0.3 s"
    fp16 = row("fp16", 0.0, None, 500, not_timed=why) | {"time_ms": None, "samples": 0}
    rows = [row("fp32", 7.0, 0.3, 1000), row("bf16", 10.0, 0.4, 500), fp16]
    s = session("cpu:bfloat16", rows, probe_ratio=1.4)
    out = advise(s, list(autocast_slower(s)))
    (rec,) = [f for f in out if f.id.startswith("prefer-")]
    assert rec.id == "prefer-fp32" and rec.evidence["measured"] is True
    assert "fp16" not in rec.evidence["times_ms"] and "fp16" not in rec.evidence["tied"]
    assert rec.evidence["not_timed"] == {"fp16": why}
    assert "FP16 not timed" in rec.evidence["compared"] and "FP16 0" not in rec.evidence["compared"]
    assert contradictions(out) == []


def test_a_switch_away_from_fp16_takes_the_scaler_setting_with_it() -> None:
    # The scaler-config corpus scenario on a busy machine: the A/B measured BF16 clearly faster
    # than the run's FP16, and "set growth_factor" (keep FP16) stood beside "train in BF16".
    rows = [row("fp32", 10.0, 0.4, 1000), row("bf16", 7.0, 0.3, 500),
            row("fp16", 70.0, 3.0, 500)]  # fmt: skip
    s = session("cpu:float16", rows, probe_ratio=7.0)
    config = Finding("grad-scaler-config", "medium", "growth_factor=256 skips 16 of 26 steps.",
                     {}, fix="scaler = torch.amp.GradScaler('cpu', growth_factor=2.0)",
                     section="numerics")  # fmt: skip
    out = advise(s, [*autocast_slower(s), config])
    assert [f.id for f in out] == ["prefer-bf16"]
    assert "grad-scaler-config" in out[0].evidence["explains"]
    assert contradictions(out) == []
