"""The "Which precision" section: the choice, its uncertainty, the safety rule, module causes."""

from __future__ import annotations

from ampdiag.analysis.precision_choice import SAFETY
from ampdiag.render.sections.precision_ab import build
from ampdiag.session import Session


def test_the_section_states_the_rule_the_ties_and_where_time_goes() -> None:
    rows = [
        {"precision": "fp32", "time_ms": 10.0, "time_spread_ms": 1.0, "safe": True},
        {"precision": "bf16", "time_ms": 9.5, "time_spread_ms": 1.0, "speedup": 1.05,
         "speedup_low": 0.86, "speedup_high": 1.29, "faster": None, "safe": True},
        {"precision": "fp16", "time_ms": 500.0, "time_spread_ms": 9.0, "speedup": 0.02,
         "faster": False, "safe": True,
         "modules": [{"module": "conv2", "fp32_ms": 0.67, "ms": 47.0, "cast_ms": 0.05,
                      "kernel_ms": 46.95, "cause": "kernels"}]},
    ]  # fmt: skip
    ab = {"results": rows, "recommended": "bf16", "uncertain": True, "tied": ["bf16", "fp32"],
          "reason": "r", "criteria": dict(SAFETY), "budget_s": 2.0, "spent_s": 1.0}  # fmt: skip
    section = build(Session(sections={"speed_probe": {"precisions": ab}}))
    assert section is not None
    html = str(section.html)
    assert (
        "Recommended: BF16 autocast</strong> (no other measured clearly faster or slower)" in html
    )
    assert "1.05x (within the noise, 0.86–1.29x)" in html
    assert "median gradient SQNR at least 20 dB" in html and "within 1% of FP32" in html
    assert "<td>conv2</td>" in html and "slow low-precision kernels" in html
    assert "<td>670.0 µs</td><td>47.00 ms</td>" in html


def test_the_fp8_rows_name_each_layers_verdict_reason_and_filter() -> None:
    layer = {"name": "fc2", "verdict": "keep-bf16", "output_sqnr_db": 28.0,
             "grad_input_sqnr_db": 25.0, "grad_weight_sqnr_db": 38.0,
             "input": {"low_share": 0.91, "amax": 1.85e4}, "reasons": ["an outlier"]}  # fmt: skip
    fp8 = {"recipe": "tensorwise", "layers": [layer], "convert": [], "keep": ["fc2"],
           "filter": "KEEP_IN_BF16 = {'fc2'}", "loss_rel_diff_vs_bf16": 0.01,
           "speed": "speed not measured: needs an FP8 GPU"}  # fmt: skip
    ab = {"results": [{"precision": "fp32", "time_ms": 1.0}], "recommended": "fp32",
          "reason": "r", "fp8": fp8}  # fmt: skip
    section = build(Session(sections={"speed_probe": {"precisions": ab}}))
    assert section is not None
    html = str(section.html)
    assert "FP8 readiness (tensorwise recipe)" in html and "Convert 0 of 1" in html
    assert "<td>fc2</td><td>keep in BF16</td><td>28.0 dB</td>" in html
    assert "<td>91.0%</td>" in html and "an outlier" in html
    assert "KEEP_IN_BF16 = {&#39;fc2&#39;}" in html and "needs an FP8 GPU" in html


def test_a_skipped_fp8_says_why() -> None:
    ab = {"results": [{"precision": "fp32", "time_ms": 1.0}], "recommended": "fp32",
          "reason": "r", "fp8": {"skipped": "over budget"}}  # fmt: skip
    section = build(Session(sections={"speed_probe": {"precisions": ab}}))
    assert section is not None and "Not measured: over budget." in str(section.html)
