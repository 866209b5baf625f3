"""Accelerate (``Accelerator(mixed_precision="bf16")``, ``accumulate()``) under diagnose().

Accelerate wraps ``model.forward`` in autocast and skips the optimizer's update on the
micro-batches ``accumulate()`` does not sync. Truth: the updates the inner optimizer really
made (a post-hook of its own), and the autocast state a hook on the first layer reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from tests.frameworks.conftest import SETTINGS, AutocastRecorder, micro_batches, step_split

accelerate = pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

ACCUM = 2
BATCHES = 8


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    # Accelerate keeps one process-wide state; another test (HF Trainer) may have set it.
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerate_bf16_accumulate(tmp_path: Path) -> None:
    acc = accelerate.Accelerator(
        mixed_precision="bf16", cpu=True, gradient_accumulation_steps=ACCUM
    )
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    truth = AutocastRecorder(model[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(
        torch.randn(8 * BATCHES, 32), torch.randint(0, 4, (8 * BATCHES,))
    )
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader = acc.prepare(model, opt, loader)
    updates: list[int] = []
    opt.optimizer.register_step_post_hook(lambda o, a, k: updates.append(1))
    with ampdiag.diagnose(out=tmp_path / "diag", **SETTINGS) as d:
        for x, y in loader:
            with acc.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
        trained = truth.counts()
    truth.close()
    session = d.session
    assert session is not None and session.status == "ok"
    run = session.sections["run"]
    assert run["optimizers"] == ["AdamW"]
    # Steps: the updates really made (accumulate() skips the others), micro-batches each.
    assert len(updates) == BATCHES // ACCUM
    assert len(session.steps) == len(updates)
    mb = micro_batches(session)
    if mb is not None:
        assert mb == [ACCUM] * len(updates)
    # Autocast: entered by the wrapped forward, after the model's pre-hooks.
    assert trained == {"cpu:bfloat16": BATCHES}
    assert run["autocast_seen"] == trained
    assert session.environment["autocast"] == "cpu:bfloat16"
    assert session.sections["speed_probe"]["autocast"] == "cpu:bfloat16"
    assert session.sections["precision"]["autocast_dtypes"] == {"cpu": "bfloat16"}
    ids = {f.id for f in session.findings}
    assert not ids & {"low-precision-inactive", "amp-off", "grad-scaler-missing"}
    split = step_split(session)
    assert split["forward"] > 0.1 and split["backward"] > 0.1


def test_accelerate_fp16_on_a_cpu_is_not_called_a_deliberate_fp32_run(tmp_path: Path) -> None:
    # Accelerate enters no autocast and makes no GradScaler for fp16 on a CPU (its truth:
    # native_amp False, scaler None): the run is FP32 although mixed precision was asked for.
    acc = accelerate.Accelerator(mixed_precision="fp16", cpu=True)
    assert not acc.native_amp and acc.scaler is None
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    with ampdiag.diagnose(out=tmp_path / "diag", **(SETTINGS | {"profile": False})) as d:
        for _ in range(3):
            loss = model(torch.randn(8, 32)).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    session = d.session
    assert session is not None
    assert session.sections["run"]["autocast_seen"] == {"none": 3}
    assert session.environment["framework_precision"] == {"accelerate": "fp16"}
    found = {f.id: f for f in session.findings}
    assert found["low-precision-inactive"].severity == "high" and "amp-off" not in found
