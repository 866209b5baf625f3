"""A live run on a GPU below compute capability 8.0 records BF16 as unsupported, and its A/B
times no BF16 or TF32, although ``torch.cuda.is_bf16_supported()`` says True there (it counts
emulation). The GPU is simulated: torch's device queries answer as a Tesla P40 (6.1) or a
V100 (7.0) would, and as an A100 (8.0) for the control."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ampdiag.config import DiagnoseConfig
from ampdiag.sources.live.collectors.base import RunContext
from ampdiag.sources.live.compare import supported_precisions
from ampdiag.sources.live.environment import describe_environment

GPUS = {(6, 1): "Tesla P40", (7, 0): "Tesla V100-SXM2-16GB", (8, 0): "NVIDIA A100-SXM4-40GB"}


def _as_gpu(monkeypatch: pytest.MonkeyPatch, cap: tuple[int, int]) -> None:
    props = SimpleNamespace(name=GPUS[cap], total_memory=16 << 30, major=cap[0], minor=cap[1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: cap)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # as torch says


@pytest.mark.parametrize("cap", list(GPUS))
def test_bf16_and_tf32_follow_the_capability(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cap: tuple[int, int]
) -> None:
    _as_gpu(monkeypatch, cap)
    run = RunContext(out=tmp_path, config=DiagnoseConfig(), device_type="cuda")
    env = describe_environment(run)
    ampere = cap >= (8, 0)
    assert env["device_capability"] == f"{cap[0]}.{cap[1]}"
    assert env["bf16_supported"] is ampere
    timed = supported_precisions(torch.device("cuda"))
    assert ("bf16" in timed, "tf32" in timed) == (ampere, ampere)
    assert {"fp32", "fp16"} <= set(timed)
