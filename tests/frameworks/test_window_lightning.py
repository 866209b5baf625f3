"""``ampdiag.integrations.lightning.DiagnoseCallback``: a window of a Lightning run's steps.

``precision="bf16-mixed"``, Adam (a closure optimizer: forward and backward run inside
``optimizer.step``), ``accumulate_grad_batches=2``, dropout. Truth from Lightning itself,
measured without ampdiag: the same run without the callback (its final parameters), and the
module's own record of ``trainer.global_step`` and the loss of every batch, and of torch's
global hook dicts at each batch's start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from tests.frameworks.conftest import SETTINGS
from tests.test_step_window import installed

L = pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

STEPS = 10
WINDOW = (3, 6)
ACCUM = 2


class Classifier(L.LightningModule):  # type: ignore[misc]
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))
        self.losses: dict[int, list[float]] = {}
        self.hooks: list[tuple[int, tuple[int, int, int, int, bool]]] = []
        self.fail_at = fail_at

    def on_train_batch_start(self, batch: Any, index: int) -> None:
        self.hooks.append((self.trainer.global_step, installed()))

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        if self.trainer.global_step == self.fail_at:
            raise RuntimeError("boom")
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.setdefault(self.trainer.global_step, []).append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def fit(tmp_path: Path, callbacks: list[Any], fail_at: int | None = None) -> Classifier:
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    module = Classifier(fail_at)
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        max_steps=STEPS,
        accumulate_grad_batches=ACCUM,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
    )
    trainer.fit(module, loader)
    assert trainer.global_step == STEPS
    return module


def test_callback_diagnoses_the_window_and_leaves_training_bit_identical(tmp_path: Path) -> None:
    from ampdiag.integrations.lightning import DiagnoseCallback

    before = installed()
    plain = fit(tmp_path / "plain", [])
    callback = DiagnoseCallback(steps=WINDOW, out=tmp_path / "diag", sample_every=1, **SETTINGS)
    module = fit(tmp_path / "run", [callback])
    assert installed() == before
    plain_params = dict(plain.named_parameters())
    for name, p in module.named_parameters():
        assert torch.equal(p, plain_params[name]), name
    session = callback.session
    assert session is not None and session.status == "ok"
    assert ampdiag.load(tmp_path / "diag").steps == session.steps
    # The window's steps as Lightning numbers them, each with its two batches' losses (the
    # loss backpropagated is each batch's divided by accumulate_grad_batches).
    assert [s["index"] for s in session.steps] == list(range(*WINDOW))
    assert [s["micro_batches"] for s in session.steps] == [ACCUM] * (WINDOW[1] - WINDOW[0])
    expected = [sum(module.losses[i]) / ACCUM for i in range(*WINDOW)]
    assert [s["loss"] for s in session.steps] == pytest.approx(expected, rel=1e-5)
    run = session.sections["run"]
    assert run["models"][0]["class"] == "Sequential" and run["optimizers"] == ["Adam"]
    assert run["autocast_seen"] == {"cpu:bfloat16": (WINDOW[1] - WINDOW[0]) * ACCUM}
    assert [s["step"] for s in session.sections["gradients"]["steps"]] == list(range(*WINDOW))
    assert session.findings
    # Before the window only the sentinel watches (the loss's backward patch throughout;
    # torch's module hooks only while the first step finds the model); after it nothing is
    # installed. (Lightning calls the callbacks' on_train_batch_start before the module's.)
    early = [h for step, h in module.hooks if step < WINDOW[0]]
    assert early[0][0] == before[0] + 1 and all(h[4] for h in early)
    assert all(h[:2] == before[:2] for h in early[ACCUM:])
    late = [h for step, h in module.hooks if step >= WINDOW[1]]
    assert late == [before] * (ACCUM * (STEPS - WINDOW[1]))
    assert session.sections["sentinel"]["steps_watched"] == WINDOW[1]  # from step 0
    assert all(h[0] > before[0] for step, h in module.hooks if WINDOW[0] <= step < WINDOW[1])


def test_an_exception_inside_the_window_closes_it_with_the_error(tmp_path: Path) -> None:
    from ampdiag.integrations.lightning import DiagnoseCallback

    before = installed()
    callback = DiagnoseCallback(steps=WINDOW, out=tmp_path / "diag", **SETTINGS)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path / "run", [callback], fail_at=WINDOW[0] + 1)
    assert installed() == before
    session = ampdiag.load(tmp_path / "diag")
    assert session.status == "error" and "boom" in str(session.error)
    assert [s["index"] for s in session.steps] == [WINDOW[0]]


def test_a_callback_with_no_window_diagnoses_every_step(tmp_path: Path) -> None:
    from ampdiag.integrations.lightning import DiagnoseCallback

    callback = DiagnoseCallback(out=tmp_path / "diag", **SETTINGS)
    module = fit(tmp_path / "run", [callback])
    session = callback.session
    assert session is not None and session.status == "ok"
    assert [s["index"] for s in session.steps] == list(range(STEPS))
    expected = [sum(module.losses[i]) / ACCUM for i in range(STEPS)]
    assert [s["loss"] for s in session.steps] == pytest.approx(expected, rel=1e-5)
    assert session.sections["run"]["window"]["planned"] == [0, None]
