"""The FP16 underflow scenarios' shared run: an MLP in FP16 autocast whose loss is multiplied
by a small factor (as a mean over a huge batch, or a loss weight, would), with or without a
GradScaler of a given scale.

Truth, measured without ampdiag on every step: the FP32 gradient entering FP16 at the
autocast boundary (the model's output; replayed from the output in FP32), multiplied by the
scale in use, and how many of its nonzero values FP16 holds as zero or subnormal (cast to FP16
and compared); the parameter gradients that the FP16 run left exactly zero; and the smallest
power-of-two scale that keeps FP16's loss under 1% (`harness.needed_scale_log2`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Truth, diagnose, fp16_lost, needed_scale_log2
from tests.scenarios.harness import seeded, session_of

STEPS = 6


def run_underflow(
    out: Path,
    loss_mul: float,
    init_scale: float | None,
    *,
    spread: float | None = None,
    **settings: Any,
) -> tuple[Session, dict[str, Any]]:
    """Trains and measures; ``spread`` multiplies half the output columns' gradients (a
    range wider than FP16's)."""
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        scaler = (
            torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**6)
            if init_scale is not None
            else None
        )
        weights = torch.ones(10)
        if spread is not None:
            weights[5:] = spread

        def loss_fn(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return models.loss_of(o * weights, y)

        lost = [0, 0]
        true_grads: list[torch.Tensor] = []
        zero = [0, 0]

        def measure(step: int, o: torch.Tensor, loss: torch.Tensor, batch: models.Batch) -> None:
            ref = o.detach().float().requires_grad_()
            (g,) = torch.autograd.grad(loss_fn(ref, batch[1]) * loss_mul, ref)
            scale = scaler.get_scale() if scaler is not None else 1.0
            a, b = fp16_lost(g * scale)
            lost[0] += a
            lost[1] += b
            true_grads.append(g)

        def count_zero_grads(step: int) -> None:
            if step > 0:
                for p in setup.model.parameters():
                    if p.grad is not None:
                        zero[0] += int((p.grad == 0).sum())
                        zero[1] += p.grad.numel()

        with diagnose(out, **settings) as d:
            models.train(
                setup.model,
                data,
                dtype=torch.float16,
                scaler=scaler,
                loss_mul=loss_mul,
                loss_fn=loss_fn,
                before_backward=measure,
                step_hook=count_zero_grads,
            )
    k = needed_scale_log2(true_grads)
    measured = {
        "boundary_lost_fraction": lost[0] / lost[1],
        "param_grad_zero_fraction": zero[0] / zero[1] if zero[1] else None,
        "needed_scale_log2": k,
    }
    return session_of(d), measured


def underflow_expect(measured: dict[str, Any], tol: float = 0.03) -> Expect:
    """fp16-grad-underflow naming the measured lost share and the needed init_scale."""
    k = measured["needed_scale_log2"]
    ev: dict[str, tuple[Any, float]] = {
        "underflow_fraction": (measured["boundary_lost_fraction"], tol),
        "scale_reaches_target": (k is not None, 0.0),
    }
    if k is not None:
        ev["recommended_init_scale"] = (2.0**k, 0.0)
    return Expect("fp16-grad-underflow", evidence=ev)


def truth(measured: dict[str, Any], *more: Expect, forbid: set[str] | None = None) -> Truth:
    return Truth(
        expect=[underflow_expect(measured), *more], forbid=forbid or set(), measured=measured
    )
