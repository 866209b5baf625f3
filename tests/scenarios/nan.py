"""The NaN scenarios' shared run: an MLP with a `Poison` module in its body that makes a NaN
at one step, in its forward output, in its backward (the gradient with respect to its input),
or in the loss.

Truth is recorded where the fault is injected, without ampdiag: the step at which the poison
actually produced a non-finite value (it checks its own output or gradient) and its module
name (from ``named_modules``); for the loss, the step at which the loss came out non-finite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Truth, diagnose, seeded, session_of


class _NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, poison: Poison) -> torch.Tensor:
        ctx.poison = poison
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        poison = ctx.poison
        if poison.now == poison.at:
            grad = grad * float("nan")
            poison.fired.append(poison.now)
        return grad, None


class Poison(nn.Module):
    """Identity, except at step ``at``: NaN output ("forward") or NaN input gradient
    ("backward"). ``now`` is set by the loop; ``fired`` records when it really produced one."""

    def __init__(self, phase: str, at: int) -> None:
        super().__init__()
        self.phase, self.at, self.now = phase, at, -1
        self.fired: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.phase == "backward":
            return _NaNGrad.apply(x, self)  # type: ignore[no-untyped-call,no-any-return]
        if self.phase == "forward" and self.now == self.at:
            x = x * float("nan")
            if not bool(torch.isfinite(x).all()):
                self.fired.append(self.now)
        return x


def run_nan(
    out: Path,
    phase: str,
    at: int,
    steps: int,
    dtype: torch.dtype | None,
    scaler: bool = False,
    **settings: Any,
) -> tuple[Session, Truth]:
    """Trains ``steps`` steps with the fault at step ``at`` in ``phase`` ("forward",
    "backward", "loss"); expects nonfinite-origin naming the step and module."""
    with seeded(0):
        setup = models.make("mlp")
        model = setup.model
        poison = Poison(phase, at)
        assert isinstance(model, models.MLP)
        model.body.insert(2, poison)  # after the first Linear + ReLU
        name = next(n for n, m in model.named_modules() if m is poison)
        data = models.batches(setup, steps)
        bad_loss: list[int] = []

        def step_hook(step: int) -> None:
            poison.now = step

        def loss_fn(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = models.loss_of(o, y)
            if phase == "loss" and poison.now == at:
                loss = loss + torch.log(torch.zeros(()))  # -inf
            return loss

        def watch(step: int, o: torch.Tensor, loss: torch.Tensor, batch: models.Batch) -> None:
            if not bool(torch.isfinite(loss)):
                bad_loss.append(step)

        sc = torch.amp.GradScaler("cpu") if scaler else None
        with diagnose(out, **settings) as d:
            models.train(
                model,
                data,
                dtype=dtype,
                scaler=sc,
                step_hook=step_hook,
                loss_fn=loss_fn,
                before_backward=watch,
            )
    if phase == "loss":
        first, module = bad_loss[0], "(loss)"
    else:
        first, module = poison.fired[0], name
    measured = {"first_step": first, "module": module, "loss_nonfinite_steps": bad_loss}
    expect = Expect(
        "nonfinite-origin",
        module=module,
        step=first,
        evidence={"phase": (phase, 0.0)},
    )
    return session_of(d), Truth(expect=[expect], measured=measured)
