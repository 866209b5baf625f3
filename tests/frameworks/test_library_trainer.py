"""A library's trainer that builds its own Accelerator: the fix names that trainer's arguments.

denoising-diffusion-pytorch's ``Trainer(..., amp=False, mixed_precision_type="fp16",
gradient_accumulate_every=1)`` makes ``Accelerator(mixed_precision=mixed_precision_type if amp
else "no")`` inside its ``__init__``: its user never writes ``Accelerator(...)``, so a fix
that says ``Accelerator(mixed_precision="bf16")`` is code they have nowhere to put. The
library here is written from scratch in that shape and installed the way a library is (a
package under a ``site-packages`` folder on ``sys.path``), then run with ``amp=True`` on a CPU,
where Accelerate's FP16 enters no autocast and the run trains in FP32.

Truth is the library itself: rebuilt with the arguments the fix gives, its forward runs under
BF16 autocast (read by a forward pre-hook, not by ampdiag).
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ampdiag
from tests.advice_scan import native_bf16_cpu
from tests.frameworks.conftest import SETTINGS, AutocastRecorder

pytestmark = pytest.mark.slow

LIBRARY = """
import torch
from accelerate import Accelerator


class Trainer:
    def __init__(self, model, data, *, train_batch_size=8, gradient_accumulate_every=1,
                 train_lr=1e-3, amp=False, mixed_precision_type="fp16", split_batches=True):
        self.accelerator = Accelerator(
            split_batches=split_batches, mixed_precision=mixed_precision_type if amp else "no",
            cpu=True)
        self.data, self.batch = data, train_batch_size
        self.gradient_accumulate_every = gradient_accumulate_every
        opt = torch.optim.Adam(model.parameters(), lr=train_lr)
        self.model, self.opt = self.accelerator.prepare(model, opt)

    def train(self, steps):
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            for _ in range(self.gradient_accumulate_every):
                idx = torch.randint(0, len(self.data), (self.batch,), generator=g)
                with self.accelerator.autocast():
                    loss = self.model(self.data[idx]).pow(2).mean()
                self.accelerator.backward(loss / self.gradient_accumulate_every)
            self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad()
"""


@pytest.fixture
def library(tmp_path: Path) -> Iterator[Any]:
    """The trainer library, installed under a ``site-packages`` folder, removed afterwards."""
    root = tmp_path / "site-packages"
    (root / "ddpm_style").mkdir(parents=True)
    (root / "ddpm_style" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("ddpm_style")
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("ddpm_style", None)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))


def test_library_trainer_is_told_its_own_arguments(
    tmp_path: Path, accelerate_state: Any, library: Any
) -> None:
    data = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    model = _model()
    trainer = library.Trainer(model, data, gradient_accumulate_every=2, amp=True)
    with ampdiag.diagnose(out=tmp_path / "diag", **(SETTINGS | {"speed_probe": False})) as d:
        trainer.train(4)
    session = d.session
    assert session is not None
    fw = session.environment["framework"]
    assert (fw["name"], fw["via"]) == ("accelerate", "Trainer (ddpm_style)"), fw
    (found,) = [f for f in session.all_findings() if f.id == "low-precision-inactive"]
    assert found.title.startswith("Trainer (ddpm_style) (through Accelerate) was asked for FP16")
    # BF16 where this CPU runs it natively; FP32 kept where it emulates BF16 (slower)
    native = native_bf16_cpu()
    args = {"amp": True, "mixed_precision_type": "bf16"} if native else {"amp": False}
    written = ", ".join(f"{k}={v!r}".replace("'", '"') for k, v in args.items())
    assert f"Trainer(..., {written})" in found.fix.splitlines(), found.fix
    assert "Accelerator(" not in found.fix, found.fix

    # the fix, applied as written, trains in the precision it names
    accelerate_state.state.AcceleratorState._reset_state(reset_partial_state=True)
    fixed_model = _model()
    fixed = library.Trainer(fixed_model, data, **args)
    truth = AutocastRecorder(fixed_model[0])
    fixed.train(1)
    truth.close()
    assert truth.counts() == ({"cpu:bfloat16": 1} if native else {"none": 1})


def test_user_code_trainer_keeps_the_accelerator_line(
    tmp_path: Path, accelerate_state: Any
) -> None:
    """The same trainer in the user's own file: the Accelerator line is theirs to change."""
    path = tmp_path / "own_trainer.py"
    path.write_text(textwrap.dedent(LIBRARY))
    sys.path.insert(0, str(tmp_path))
    try:
        own = importlib.import_module("own_trainer")
        data = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
        trainer = own.Trainer(_model(), data, amp=True)
        with ampdiag.diagnose(out=tmp_path / "diag", **(SETTINGS | {"speed_probe": False})) as d:
            trainer.train(3)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("own_trainer", None)
    assert d.session is not None
    assert "via" not in d.session.environment["framework"]
    (found,) = [f for f in d.session.all_findings() if f.id == "low-precision-inactive"]
    want = "bf16" if native_bf16_cpu() else "no"  # FP32 where this CPU emulates BF16
    assert f'Accelerator(mixed_precision="{want}")' in found.fix, found.fix
