"""The verdict word fits the findings, and the lead is the most severe measured consequence.

Sessions built from A/B rows whose truth is in the rows themselves (times with their spreads,
the run's precision, FP16 trouble measured by the numerics rules): a speed claim alone reads
"slow", one within the measured spread "healthy", lost gradients "at risk" and lead the verdict
sentence whatever speed-up a switch also measured.
"""

from __future__ import annotations

from ampdiag.analysis import analyze
from ampdiag.analysis.verdict import category
from ampdiag.render.sections.overview import verdict
from ampdiag.session import Session
from tests.analysis.test_precision_advice import fp16_trouble, row, session


def analysed(s: Session) -> Session:
    s.findings = analyze(s)
    return s


def test_a_run_whose_only_claim_is_speed_is_slow_not_at_risk() -> None:
    # BF16 emulated on this CPU: 2x FP32's time, the whole interval beyond the 1.10x a switch needs
    rows = [row("fp32", 10.0, 0.3, 1000), row("bf16", 20.0, 0.3, 500)]
    s = analysed(session("cpu:bfloat16", rows, probe_ratio=2.0))
    actionable = [f for f in s.findings if f.severity in ("high", "medium")]
    assert [f.id for f in actionable] == ["prefer-fp32"]
    assert s.section("derived")["verdict"] == "slow"


def test_a_speed_difference_inside_the_band_is_healthy_and_keeps_the_runs_precision() -> None:
    # run_clm's case: BF16 0.93x as fast as FP32, its interval 0.88x-0.99x excluding 1: FP32's
    # gain is under the 1.10x a switch must clear, so no switch and no "tie" for the slower one
    rows = [row("fp32", 10.0, 0.3, 1000), row("bf16", 10.75, 0.3, 500)]
    s = analysed(session("cpu:bfloat16", rows, probe_ratio=1.075))
    assert not [f for f in s.findings if f.severity in ("high", "medium")]
    assert s.section("derived")["verdict"] == "healthy"
    assert not [f for f in s.findings if f.id.startswith("prefer-")]


def test_lost_gradients_lead_the_verdict_and_the_word_is_at_risk() -> None:
    # FP16 without a GradScaler (30% underflow) on a CPU where FP32 is 5x faster: the switch
    # to FP32 is measured, but what the sentence leads with is the gradients FP16 loses
    rows = [row("fp32", 10.0, 0.3, 1000), row("bf16", 30.0, 0.3, 500),
            row("fp16", 50.0, 1.0, 500)]  # fmt: skip
    s = session("cpu:float16", rows, probe_ratio=5.0)
    s.findings = analyze(s)  # rules only see the session; add the numerics rules' findings
    from ampdiag.analysis.advisors import advise
    from ampdiag.analysis.registry import run_rules

    s.findings = advise(s, [*run_rules(s), *fp16_trouble()])
    lead = verdict(s)
    assert lead.startswith("30.0% of the gradient values are lost to underflow in FP16"), lead
    assert "Train in FP32 instead of FP16" in lead and "5.00x the speed of FP16" in lead
    assert category(s, s.findings) == "at risk"
    assert s.findings[0].evidence["consequence"] == "numerics"


def test_a_bf16_report_carries_no_unlabelled_fp16_sentence() -> None:
    # "cpu:bfloat16" ends with "float16": the GradScaler section told every BF16 run that its
    # "FP16 gradients below 2^-24 flush to zero"
    from ampdiag.render.html import render_html

    rows = [row("fp32", 10.0, 0.3, 1000), row("bf16", 10.2, 0.3, 500)]
    bf16 = analysed(session("cpu:bfloat16", rows))
    fp16 = analysed(session("cpu:float16", [row("fp32", 10.0, 0.3, 1000),
                                            row("fp16", 10.2, 0.3, 500)]))  # fmt: skip
    said = "autocast without a GradScaler: FP16 gradients"
    assert said not in render_html(bf16)
    assert said in render_html(fp16)  # the sentence is there for the run it describes
