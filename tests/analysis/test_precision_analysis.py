"""Precision summaries and findings from synthetic sections and from a real run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.analysis import precision
from ampdiag.analysis.rules.precision import THRESHOLDS
from ampdiag.session import Session
from tests.advice_scan import native_bf16_cpu


def row(**kw: Any) -> dict[str, Any]:
    base = {
        "phase": "forward",
        "module": "m",
        "op": "mm",
        "autocast": True,
        "precision": "low",
        "reason": None,
        "cast_origin": None,
        "count": 1,
        "flops": 0,
        "time_us": 0.0,
        "cast_bytes": 0,
        "out_dtypes": ["bfloat16"],
        "in_dtypes": ["bfloat16"],
    }
    base.update(kw)
    return base


def sec(rows: list[dict[str, Any]], device: str = "cpu") -> dict[str, Any]:
    return {"audited": True, "step": 1, "device_type": device, "ops": rows}


def ids(s: dict[str, Any]) -> list[str]:
    session = Session(sections={"precision": s})
    from ampdiag.analysis.registry import run_rules

    return [f.id for f in run_rules(session) if f.section == "precision"]


def test_summary_shares_casts_and_modules() -> None:
    s = precision.summarize(
        sec(
            [
                row(module="a", flops=900, time_us=30.0),
                row(
                    module="b",
                    op="addmm",
                    precision="fp32",
                    reason="user-cast",
                    flops=100,
                    time_us=10.0,
                ),
                row(
                    module="b",
                    op="add",
                    precision="fp32",
                    reason="promotion",
                    time_us=60.0,
                    count=2,
                ),
                row(
                    op="_to_copy",
                    precision="cast",
                    cast_origin="autocast",
                    cast_bytes=48,
                    time_us=5.0,
                ),
                row(
                    op="_to_copy",
                    precision="cast",
                    cast_origin="autocast",
                    cast_bytes=16,
                    time_us=1.0,
                ),
                row(phase="other", precision="fp32", reason="outside-autocast", time_us=1000.0),
            ]
        )
    )
    assert s["fp32_flops_share"] == 0.1
    assert s["fp32_time_share"] == 70 / 100
    assert s["matmul"] == {
        "low_flops": 900,
        "fp32_flops": 100,
        "fp32_share": 0.1,
        "autocast_share": 1.0,
    }
    assert s["casts"]["total"] == {"count": 2, "bytes": 64, "time_us": 6.0}
    assert s["top_fp32_by_flops"][0]["op"] == "addmm"
    assert s["top_fp32_by_time"][0]["op"] == "add" and s["top_fp32_by_time"][0]["count"] == 2
    assert s["modules"]["b"]["fp32_time_us"] == 70.0 and s["modules"]["a"]["low_flops"] == 900
    assert s["reasons"]["promotion"]["count"] == 2


def test_fp32_rule_thresholds() -> None:
    just_below = THRESHOLDS.fp32_flops_share_medium - 0.01
    rows = [
        row(flops=int(1000 * (1 - just_below)), time_us=100.0),
        row(precision="fp32", reason="promotion", flops=int(1000 * just_below), time_us=1.0),
    ]
    assert "fp32-ops-in-autocast" not in ids(sec(rows))
    rows[1]["flops"] += 30
    assert "fp32-ops-in-autocast" in ids(sec(rows))
    rows = [
        row(flops=1000, time_us=60.0),
        row(precision="fp32", reason="promotion", op="add", time_us=40.0),
    ]
    # 40% of the op time in FP32 on 0 FP32 FLOPs: one step's op times are a single sample
    # that a stalled op moves, so no finding that could come and go between identical runs;
    # the share is still stated with the section's figures.
    assert "fp32-ops-in-autocast" not in ids(sec(rows))
    assert precision.summarize(sec(rows))["fp32_time_share"] == pytest.approx(0.4)


def test_device_differences_cpu_only() -> None:
    rows = [
        row(op="_softmax", module="attn", cuda_policy="fp32_set_opt_dtype"),
        row(op="mm", cuda_policy="lower_precision_fp"),
        row(op="_softmax", phase="backward", cuda_policy="fp32_set_opt_dtype"),
    ]
    diffs = precision.device_differences(sec(rows))
    assert [(d["op"], d["module"], d["cuda_dtype"]) for d in diffs] == [
        ("_softmax", "attn", "float32")
    ]
    assert precision.device_differences(sec(rows, device="cuda")) == []


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _train(tmp_path: Path, use_autocast: bool, use_scaler: bool = False) -> Session:
    torch.manual_seed(0)
    model = Mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu") if use_scaler else None
    with ampdiag.diagnose(
        model, opt, out=tmp_path, profile=False, report=False, tensorboard=False, console=False
    ) as d:
        for _ in range(2):
            x = torch.randn(8, 32)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
                loss = model(x).square().mean()
            opt.zero_grad()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
    assert d.session is not None
    return d.session


def test_low_precision_inactive_on_a_real_run(tmp_path: Path) -> None:
    # A GradScaler says mixed precision was meant; autocast never ran: high where BF16 would
    # pay; low on a CPU that emulates it, where the FP32 the run fell back to is the fast one
    meant = _train(tmp_path / "meant", use_autocast=False, use_scaler=True)
    found = {f.id: f for f in meant.findings}
    assert "low-precision-inactive" in found and "amp-off" not in found
    assert found["low-precision-inactive"].severity == ("high" if native_bf16_cpu() else "low")
    assert found["low-precision-inactive"].evidence["matmul_autocast_share"] == 0.0
    on = _train(tmp_path / "on", use_autocast=True)
    ids = {f.id for f in on.findings}
    assert "low-precision-inactive" not in ids and "amp-off" not in ids


def test_deliberate_fp32_run_says_amp_is_off(tmp_path: Path) -> None:
    off = _train(tmp_path / "off", use_autocast=False)
    found = {f.id: f for f in off.findings}
    assert "low-precision-inactive" not in found
    assert found["amp-off"].severity == "info"
    assert found["amp-off"].evidence["matmul_fp32_share"] == 1.0
