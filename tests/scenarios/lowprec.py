"""Low-precision weights, measured by the loop itself: which updates the optimizer step lost.

`run` trains a small GPT a few steps with AdamW at a small learning rate, its weights either
cast to BF16 (``model.to(torch.bfloat16)``: the optimizer updates BF16 weights) or kept in
FP32 under BF16 autocast (the control). Around every ``optimizer.step()`` it copies every
parameter and its gradient and counts, itself, the elements whose gradient was nonzero and
whose stored value the step left bit-for-bit unchanged: the updates that rounded away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

import ampdiag
from tests.scenarios import models
from tests.scenarios.harness import diagnose, seeded

STEPS = 12
LR = 1e-4


@dataclass
class Measured:
    """Per step: (nonzero-gradient elements, those left unchanged by the step)."""

    steps: list[tuple[int, int]] = field(default_factory=list)
    param_dtypes: set[str] = field(default_factory=set)
    params: int = 0
    numel: int = 0
    device: str = ""

    def share(self, step: int) -> float:
        moving, unchanged = self.steps[step]
        return unchanged / moving

    @property
    def mean_share(self) -> float:
        return sum(self.share(i) for i in range(len(self.steps))) / len(self.steps)


def run(out: Path, *, bf16_weights: bool) -> tuple[ampdiag.Diagnosis, Measured]:
    """Trains the GPT under diagnose(); returns the handle and what the loop counted."""
    measured = Measured()
    with seeded(0):
        setup = models.make("gpt")
        data = models.batches(setup, STEPS)
        model = setup.model.to(torch.bfloat16) if bf16_weights else setup.model
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        with diagnose(out) as d:
            for x, y in data:
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(x)
                models.loss_of(logits.float(), y).backward()
                params = [p for p in model.parameters() if p.grad is not None]
                before = [p.detach().clone() for p in params]
                grads = [p.grad.detach().clone() for p in params if p.grad is not None]
                opt.step()
                moving = sum(int((g != 0).sum()) for g in grads)
                unchanged = sum(
                    int(((g != 0) & (p.detach() == b)).sum())
                    for p, b, g in zip(params, before, grads, strict=True)
                )
                measured.steps.append((moving, unchanged))
    measured.param_dtypes = {str(p.dtype) for p in model.parameters()}
    measured.params = sum(1 for _ in model.parameters())
    measured.numel = sum(p.numel() for p in model.parameters())
    measured.device = next(model.parameters()).device.type
    return d, measured
