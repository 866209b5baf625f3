"""A custom autograd op after a child, inside a residual block, makes a NaN in the block's
backward at step 3 of 8 (FP32).

The block computes ``x + op(self.mlp(x))``; ``op`` is the identity in the forward, and at
step 3 its backward turns the gradient NaN. The child ``mlp`` receives a NaN output gradient
and passes it on -- it shares the block's input, so the first hook to see NaN on that input
is the child's. The value is made in the block's own backward code, after its child: the
origin must name the block (phase backward, parent code after ``block.mlp``), not the child.

Truth, recorded at the injection without ampdiag: the op's backward checks that the gradient
it received is finite and the one it returns is not, and records the step.

No FP16 advice: the run does not compute in FP16 (the NaN is not the dtype's fault).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models, nan_origin
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

AT, STEPS = 3, 8


class Block(nan_origin.Injecting):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nan_origin.NaNGrad.apply(self.mlp(x), self, AT)  # type: ignore[no-untyped-call,no-any-return]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.block = Block(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(self.block(torch.relu(self.inp(x))))


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = Net()
        setup = models.Setup(model, models.make("mlp").batch)
        data = models.batches(setup, STEPS)
        block = model.block
        names = {m: n for n, m in model.named_modules()}

        def step_hook(step: int) -> None:
            block.now = step

        with diagnose(out) as d:
            models.train(model, data, dtype=None, step_hook=step_hook)
    # the divergence replay runs the step's backward again: the same step, once more
    assert set(block.fired) == {AT}, block.fired
    between = [names[block.mlp], None]
    measured = {"first_step": block.fired[0], "module": names[block], "between": between}
    expect = Expect(
        "nonfinite-origin",
        module=names[block],
        step=block.fired[0],
        evidence={
            "phase": ("backward", 0.0),
            "parent_code": (True, 0.0),
            "between": (between, 0.0),
        },
    )
    return session_of(d), Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-block-backward-op",
    "A custom op after a child makes NaN in a residual block's backward at step 3 of 8 (FP32).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
