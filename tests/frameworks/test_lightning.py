"""Lightning (``precision="bf16-mixed"``, Adam: a closure optimizer) under diagnose().

Lightning's automatic optimisation runs forward and backward inside
``optimizer.step(closure)``. Truth: ``trainer.global_step``, the autocast state a hook on the
network reads, the gradient norm read in ``on_before_optimizer_step`` (after the closure,
before the update), and the ops Adam's update runs (counted around a lone Adam step).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from tests.frameworks.conftest import SETTINGS, AutocastRecorder, assert_attribution

L = pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

STEPS = 8
#: Every step after the profiler's warm-up step is profiled (the split is summed over them).
PROFILED = STEPS - 1


class Classifier(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        self.grad_norms: list[float] = []
        # thread CPU time of the forward (with the loss) and the backward, by optimizer step
        self.walls: dict[int, list[float]] = {}

    def _wall(self) -> list[float]:
        return self.walls.setdefault(self.trainer.global_step, [0.0, 0.0])

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        t0 = time.thread_time()
        loss = nn.functional.cross_entropy(self.net(x), y)
        self._wall()[0] += time.thread_time() - t0
        return loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        t0 = time.thread_time()
        super().backward(loss, *args, **kwargs)
        self._wall()[1] += time.thread_time() - t0

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        grads = [p.grad.flatten() for p in self.parameters() if p.grad is not None]
        self.grad_norms.append(float(torch.linalg.vector_norm(torch.cat(grads))))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3, foreach=False)


def _adam_update_ops() -> set[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kw: Any = None) -> Any:
            seen.add(func._schema.name.split("::", 1)[-1])
            return func(*args, **(kw or {}))

    p = nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4)
    with Names():
        torch.optim.Adam([p], foreach=False).step()
    return seen


def test_lightning_bf16_mixed_with_a_closure_optimizer(tmp_path: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    module = Classifier()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "pl"),
    )
    truth = AutocastRecorder(module.net[0])
    settings = SETTINGS | {"profile_active": PROFILED}
    with ampdiag.diagnose(
        out=tmp_path / "diag", sample_every=1, numerics_sample_elements=0, **settings
    ) as d:
        trainer.fit(module, loader)
        trained = truth.counts()
    truth.close()
    session = d.session
    assert session is not None and session.status == "ok"
    run = session.sections["run"]
    # Discovery: training_step calls self.net, the root module with parameters.
    assert run["models"][0]["class"] == "Sequential"
    assert run["optimizers"] == ["Adam"]
    assert trainer.global_step == STEPS and len(session.steps) == STEPS
    # Autocast: Lightning's precision plugin, as the network saw it.
    assert trained == {"cpu:bfloat16": STEPS}
    assert run["autocast_seen"] == trained
    assert session.environment["autocast"] == "cpu:bfloat16"
    # Gradients: each step's own, read after the closure (Lightning reads them there too).
    norms = [s["norm"] for s in session.sections["gradients"]["steps"]]
    assert norms == pytest.approx(module.grad_norms, rel=1e-5)
    # The audit holds the closure's forward and backward and none of Adam's update ops.
    ops = session.sections["precision"]["ops"]
    assert {r["phase"] for r in ops} == {"forward", "backward"}
    audited = {r["op"] for r in ops}
    assert {"addcdiv_", "addcmul_", "sqrt"} <= _adam_update_ops()
    assert not {"addcdiv_", "addcmul_", "sqrt", "lerp_"} & audited
    # The step split: forward and backward ran inside Optimizer.step, and count as such.
    # (Without the closure annotation everything in the closure counts as optimizer, as its
    # forward and backward run inside Optimizer.step: the attribution would be near zero.)
    assert_attribution(session, module.walls, PROFILED)
    ids = {f.id for f in session.findings}
    assert not ids & {"low-precision-inactive", "amp-off", "grad-scaler-missing"}
