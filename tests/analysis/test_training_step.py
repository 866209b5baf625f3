"""The one training step per precision every fix shows (`terms.training_step`), run by torch.

A user pastes it into their loop: each precision's code must run as written on the device it
names, train (the weights move), in the precision it says (the forward's output dtype), and a
fix that changes precision names the run's framework setting before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

from ampdiag.analysis.advisors import terms
from ampdiag.analysis.rules.autocast_speed import autocast_slower
from tests.analysis.test_precision_advice import row, session


@contextmanager
def restored_tf32() -> Iterator[None]:
    """TF32's code sets torch's global TF32 flags: put them back."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32),
     ("tf32", torch.float32)],
)  # fmt: skip
def test_each_precision_runs_as_written_and_trains_in_it(
    precision: str, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    seen: list[torch.dtype] = []
    model.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    before = model.weight.detach().clone()
    names: dict[str, Any] = {
        "torch": torch,
        "model": model,
        "x": torch.randn(16, 8),
        "y": torch.randn(16, 1),
        "loss_fn": nn.functional.mse_loss,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "device": torch.device("cpu"),
    }
    code = terms.training_step(
        precision, "cpu", init_scale=2.0**10 if precision == "fp16" else None
    )
    with restored_tf32():
        exec(code, names)
    assert seen == [dtype], code
    assert not torch.equal(model.weight.detach(), before), code


def test_a_slower_autocast_names_the_trainer_setting_first() -> None:
    """HF Trainer, BF16 measured 2x FP32's time: the fix leads with TrainingArguments."""
    rows = [row("fp32", 10.0, 0.5, 1000), row("bf16", 20.0, 0.5, 500),
            row("fp16", 500.0, 20.0, 500)]  # fmt: skip
    framework = {"name": "hf-trainer", "precision": "bf16", "flags": ["--bf16"]}
    s = session("cpu:bfloat16", rows, probe_ratio=2.0, framework=framework)
    (f,) = autocast_slower(s)
    setting = "TrainingArguments(..., bf16=False, fp16=False)"
    assert setting in f.fix and f.fix.index(setting) < f.fix.index(terms.PLAIN), f.fix
