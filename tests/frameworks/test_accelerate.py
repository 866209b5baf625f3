"""Accelerate (``Accelerator(mixed_precision="bf16")``, ``accumulate()``) under diagnose().

Accelerate wraps ``model.forward`` in autocast and skips the optimizer's update on the
micro-batches ``accumulate()`` does not sync. Truth: the updates the inner optimizer really
made (a post-hook of its own), and the autocast state a hook on the first layer reads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from tests.advice_scan import native_bf16_cpu
from tests.frameworks.conftest import SETTINGS, AutocastRecorder, assert_attribution, micro_batches

accelerate = pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

ACCUM = 2
BATCHES = 16
#: Every step after the profiler's warm-up step is profiled: the step split is their median.
PROFILED = BATCHES // ACCUM - 1


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
    # The loop's own count: the micro-batches (acc.backward calls) before each real update.
    backwards: dict[int, int] = {}
    # Thread CPU time of each micro-batch's forward (with the loss) and backward, by step.
    walls: dict[int, list[float]] = {}
    settings = SETTINGS | {"profile_active": PROFILED}
    with ampdiag.diagnose(out=tmp_path / "diag", **settings) as d:
        for x, y in loader:
            with acc.accumulate(model):
                t0 = time.thread_time()
                loss = nn.functional.cross_entropy(model(x), y)
                t1 = time.thread_time()
                acc.backward(loss)
                t2 = time.thread_time()
                backwards[len(updates)] = backwards.get(len(updates), 0) + 1
                walls.setdefault(len(updates), [0.0, 0.0])
                walls[len(updates)][0] += t1 - t0
                walls[len(updates)][1] += t2 - t1
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
    assert [backwards[i] for i in range(len(updates))] == [ACCUM] * len(updates)
    assert micro_batches(session) == [backwards[i] for i in range(len(updates))]
    # Autocast: entered by the wrapped forward, after the model's pre-hooks.
    assert trained == {"cpu:bfloat16": BATCHES}
    assert run["autocast_seen"] == trained
    assert session.environment["autocast"] == "cpu:bfloat16"
    assert session.sections["speed_probe"]["autocast"] == "cpu:bfloat16"
    assert session.sections["precision"]["autocast_dtypes"] == {"cpu": "bfloat16"}
    ids = {f.id for f in session.findings}
    assert not ids & {"low-precision-inactive", "amp-off", "grad-scaler-missing"}
    # The step split: the wrapped forward's ops (and the loss's) count as forward and
    # acc.backward() as backward, in every profiled step.
    assert_attribution(session, walls, PROFILED)


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
    # high where this CPU runs BF16 natively; low where it emulates it (FP32 is fast there)
    want = "high" if native_bf16_cpu() else "low"
    assert found["low-precision-inactive"].severity == want and "amp-off" not in found


def _train_plain(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 32)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16"])
def test_an_earlier_accelerator_does_not_mark_a_later_plain_fp32_run(
    tmp_path: Path, mixed_precision: str
) -> None:
    # One process (a notebook): an Accelerate run first, then a plain FP32 run of another
    # model and optimizer. Accelerate's request stays in its process-wide state (nothing
    # resets it between the two here), but it is no part of the second run.
    acc = accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    first = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    first_opt = torch.optim.SGD(first.parameters(), lr=1e-3)
    first, first_opt = acc.prepare(first, first_opt)
    for _ in range(3):
        acc.backward(first(torch.randn(8, 32)).pow(2).mean())
        first_opt.step()
        first_opt.zero_grad()
    assert accelerate.state.AcceleratorState().mixed_precision == mixed_precision

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    truth = AutocastRecorder(model[0])
    with ampdiag.diagnose(out=tmp_path / "diag", **(SETTINGS | {"profile": False})) as d:
        _train_plain(model, opt)
    truth.close()
    # Truth: never prepared (its forward is its class's, no Accelerate wrapper holds its
    # optimizer) and never under autocast.
    assert "forward" not in vars(model)
    assert not any(o.optimizer is opt for o in acc._optimizers)
    assert truth.counts() == {"none": 3}
    session = d.session
    assert session is not None and session.status == "ok"
    assert session.environment["framework_precision"] == {}
    found = {f.id: f for f in session.findings}
    assert found["amp-off"].severity == "info" and "low-precision-inactive" not in found


def test_an_accelerate_optimizer_without_its_model_prepared_is_framework_asked(
    tmp_path: Path,
) -> None:
    # Accelerate asked for bf16 and prepared the optimizer, but the model was left out of
    # prepare(): its forward never enters autocast, so the run trains in FP32 against the
    # user's request. No model carries Accelerate's mark; the optimizer does.
    acc = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=1e-3))
    truth = AutocastRecorder(model[0])
    with ampdiag.diagnose(out=tmp_path / "diag", **(SETTINGS | {"profile": False})) as d:
        for _ in range(3):
            acc.backward(model(torch.randn(8, 32)).pow(2).mean())
            opt.step()
            opt.zero_grad()
    truth.close()
    assert isinstance(opt, accelerate.optimizer.AcceleratedOptimizer)
    assert "forward" not in vars(model) and truth.counts() == {"none": 3}
    session = d.session
    assert session is not None
    # ampdiag sees the optimizer Accelerate wraps, not the wrapper (its hooks fire there).
    assert session.sections["run"]["optimizers"] == ["SGD"]
    assert session.environment["framework_precision"] == {"accelerate": "bf16"}
    found = {f.id: f for f in session.findings}
    # high where this CPU runs BF16 natively; low where it emulates it (FP32 is fast there)
    want = "high" if native_bf16_cpu() else "low"
    assert found["low-precision-inactive"].severity == want and "amp-off" not in found
