"""The precision report section: table, reasons, casts, CUDA differences, per-module bars."""

from __future__ import annotations

from typing import Any

from ampdiag.analysis.derive import derive
from ampdiag.render.sections import precision
from ampdiag.session import Session


def _rows() -> list[dict[str, Any]]:
    common = {
        "phase": "forward",
        "autocast": True,
        "count": 1,
        "cast_bytes": 0,
        "in_dtypes": ["bfloat16"],
        "out_dtypes": ["bfloat16"],
        "cast_origin": None,
    }
    return [
        {
            **common,
            "module": "blocks.0.mm",
            "op": "mm",
            "precision": "low",
            "reason": None,
            "flops": 1000,
            "time_us": 50.0,
        },
        {
            **common,
            "module": "blocks.0.<script>",
            "op": "native_layer_norm",
            "precision": "fp32",
            "reason": "promotion",
            "flops": 0,
            "time_us": 20.0,
            "out_dtypes": ["float32"],
        },
        {
            **common,
            "module": "blocks.0.attn",
            "op": "_softmax",
            "precision": "low",
            "reason": None,
            "flops": 0,
            "time_us": 5.0,
            "cuda_policy": "fp32_set_opt_dtype",
        },
        {
            **common,
            "module": "blocks.0",
            "op": "_to_copy",
            "precision": "cast",
            "reason": None,
            "flops": 0,
            "time_us": 2.0,
            "cast_origin": "autocast",
            "cast_bytes": 96,
        },
    ]


def test_section_renders_tables_figure_and_escapes() -> None:
    session = Session(
        sections={
            "precision": {
                "audited": True,
                "step": 1,
                "device_type": "cpu",
                "ops": _rows(),
                "cuda_policy_source": "header+dispatcher",
                "autocast_dtypes": {"cpu": "bfloat16"},
            }
        }
    )
    derive(session)  # the summary is the derive step's; the section only formats it
    built = precision.build(session)
    assert built is not None and built.id == "precision"
    html = str(built.html)
    assert "native_layer_norm" in html and "promotion" in html
    assert "&lt;script&gt;" in html and "<script>" not in html
    assert "On CUDA these ops would run differently" in html and "_softmax" in html
    assert built.figures == ["precision-modules"] and "<svg" in html
    assert "FP32 0.0% of FLOPs" in built.summary


def test_section_says_why_not_audited() -> None:
    session = Session(sections={"precision": {"audited": False, "not_audited_reason": "too short"}})
    built = precision.build(session)
    assert built is not None and "too short" in str(built.html)
    assert precision.build(Session()) is None
