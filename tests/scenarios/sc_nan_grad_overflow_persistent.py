"""One layer's FP16 input gradient overflows on every step (FP16 autocast + GradScaler): the
scaler skips every step and its scale collapses from 65536.

``big`` is a wide linear layer (64 -> 2048) initialised with weights far too large (x 4e5:
up to 50000) behind one with weights far too small (x 1e-4): the forward stays finite (tiny
inputs times huge weights), but the gradient ``big`` sends back, its weights' transpose times
the scaled output gradient summed over 2048 outputs, passes FP16's 65504 from the first step
on (scale 65536) and for as long as the scale allows; at the last, smallest scales the large
gradient it still sends back overflows the first layer's weight gradient. The scaler skips
every step. This is no search for a scale:
the skips persist, so nonfinite-origin must name the layer whose backward made the inf
(its output gradient finite, its input gradient not), the first step, and the skips.

Truth, without ampdiag: the layer checks the gradients of its own input and output on every
step (hooks on its own tensors) and records the steps where the output gradient was finite
and the input gradient not (the first is the origin); the loop counts the skipped steps
itself (the weights did not move) and reads the scale before and after each step from the
scaler.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS = 14


class Overflowing(nn.Linear):
    """A linear layer that records the steps its backward turned finite gradients into inf."""

    def __init__(self, dim: int, wide: int) -> None:
        super().__init__(dim, wide)
        self.now = -1
        self.out_ok: dict[int, bool] = {}
        self.made: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if torch.is_grad_enabled() and x.requires_grad:
            step = self.now
            y.register_hook(lambda g: self.out_ok.__setitem__(step, bool(torch.isfinite(g).all())))
            x.register_hook(lambda g: self._check_input(step, g))
        return y

    def _check_input(self, step: int, grad: torch.Tensor) -> None:
        if self.out_ok.get(step) and not bool(torch.isfinite(grad).all()):
            self.made.append(step)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(32, 64)
        self.big = Overflowing(64, 2048)
        self.head = nn.Linear(2048, 10)
        with torch.no_grad():
            self.small.weight.mul_(1e-4)
            self.small.bias.mul_(1e-4)
            self.big.weight.mul_(4e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.big(torch.relu(self.small(x)))))


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = Net()
        setup = models.Setup(model, models.make("mlp").batch)
        data = models.batches(setup, STEPS)
        scaler = torch.amp.GradScaler("cpu")
        skipped: list[int] = []
        scales: list[float] = []
        before: list[torch.Tensor] = []
        names = {m: n for n, m in model.named_modules()}

        def step_hook(step: int) -> None:
            model.big.now = step
            if before and all(
                torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
            ):
                skipped.append(step - 1)
            before[:] = [p.detach().clone() for p in model.parameters()]
            scales.append(scaler.get_scale())

        with diagnose(out) as d:
            models.train(
                model,
                data,
                dtype=torch.float16,
                scaler=scaler,
                step_hook=step_hook,
            )
            step_hook(len(data))
    made = model.big.made
    assert made and made[0] == 0 and skipped == list(range(STEPS)), (made, skipped)
    measured = {
        "module": names[model.big],
        "overflow_steps": made,
        "skipped": skipped,
        "scale_initial": scales[0],
        "scale_min": min(scales),
    }
    return session_of(d), Truth(
        expect=[
            Expect(
                "nonfinite-origin",
                module=names[model.big],
                step=made[0],
                evidence={
                    "phase": ("backward", 0.0),
                    "kind": ("input gradient", 0.0),
                    "skipped": (len(skipped), 0),
                    "steps_with_nonfinite": (len(skipped), 0),
                },
            ),
            Expect(
                "skipped-steps",
                evidence={"skipped": (len(skipped), 0), "steps": (STEPS, 0)},
            ),
            Expect(
                "loss-scale-collapse",
                evidence={"scale_initial": (scales[0], 0), "scale_min": (min(scales), 0)},
            ),
        ],
        measured=measured,
    )


SCENARIO = Scenario(
    "nan-grad-overflow-persistent",
    "One layer's FP16 input gradient overflows every step: all 14 skipped, the scale collapses.",
    run,
)
