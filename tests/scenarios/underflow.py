"""The FP16 underflow scenarios' shared run: an MLP in FP16 autocast whose loss is multiplied
by a small factor (as a mean over a huge batch, or a loss weight, would), with or without a
GradScaler of a given scale.

Truth, measured without ampdiag on every step:

* boundary: the FP32 gradient entering FP16 at the autocast boundary (the model's output;
  replayed from the output in FP32), multiplied by the scale in use, and how many of its
  nonzero values FP16 holds as zero or subnormal (cast to FP16 and compared);
* inside the model: the share of the nonzero true gradient values entering each module
  (containers included) that FP16 holds as zero or subnormal at the scale in use, on the
  steps ampdiag samples (`ampdiag.config.is_sampled_step`), the true values from an FP32
  replay of each step after the run (a fresh model loaded with that step's weights, no
  autocast, same batch; own tensor hooks on every module's output); and the share of the
  nonzero parameter gradients (before the optimizer) that are subnormal;
* ``underflow_fraction`` = the largest of the three (ampdiag's documented definition);
* the parameter gradients the FP16 run left exactly zero;
* per sampled step, the smallest power-of-two scale that keeps FP16's loss under 1%
  (`harness.needed_scale_log2`) of that step's true gradients entering every module; the
  largest of them is the init_scale ampdiag must recommend.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ampdiag.config import DiagnoseConfig, is_sampled_step
from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    Expect,
    Truth,
    diagnose,
    fp16_lost,
    needed_scale_log2,
    seeded,
    session_of,
)

STEPS = 6


def run_underflow(
    out: Path,
    loss_mul: float,
    init_scale: float | None,
    *,
    spread: float | None = None,
    prepare: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
    **settings: Any,
) -> tuple[Session, dict[str, Any]]:
    """Trains and measures; ``spread`` multiplies half the output columns' gradients (a
    range wider than FP16's). ``prepare`` makes the model enter FP16 autocast inside its own
    forward (it returns the model to train, with the MLP's parameters): the loop then enters
    none, and the truth is still the plain MLP's FP32 forward."""
    with seeded(0):
        setup = models.make("mlp")
        model = prepare(setup.model) if prepare is not None else setup.model
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
        zero = [0, 0]
        inside = [0, 0]
        params = [0, 0]

        def count_subnormal(into: list[int], g: torch.Tensor) -> None:
            g = g.detach().double()
            nz = g != 0
            into[0] += int((nz & (g.abs() < 2.0**-14)).sum())
            into[1] += int(nz.sum())

        def after_backward(step: int) -> None:
            for p in model.parameters():
                if p.grad is not None:
                    count_subnormal(params, p.grad)

        replays: list[tuple[int, float, dict[str, torch.Tensor], models.Batch]] = []

        def measure(step: int, o: torch.Tensor, loss: torch.Tensor, batch: models.Batch) -> None:
            ref = o.detach().float().requires_grad_()
            (g,) = torch.autograd.grad(loss_fn(ref, batch[1]) * loss_mul, ref)
            scale = scaler.get_scale() if scaler is not None else 1.0
            a, b = fp16_lost(g * scale)
            lost[0] += a
            lost[1] += b
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            replays.append((step, scale, state, batch))

        def count_zero_grads(step: int) -> None:
            if step > 0:
                for p in model.parameters():
                    if p.grad is not None:
                        zero[0] += int((p.grad == 0).sum())
                        zero[1] += p.grad.numel()

        with diagnose(out, **settings) as d:
            models.train(
                model,
                data,
                dtype=torch.float16 if prepare is None else None,
                scaler=scaler,
                loss_mul=loss_mul,
                loss_fn=loss_fn,
                before_backward=measure,
                step_hook=count_zero_grads,
                after_backward=after_backward,
            )

        config = DiagnoseConfig(**{k: v for k, v in settings.items() if k == "sample_every"})
        needed: list[int | None] = []
        for step, scale, state, (x, y) in replays:  # the FP32 reference, outside ampdiag's view
            if not is_sampled_step(config, step):
                continue
            true_grads: list[torch.Tensor] = []

            ref = models.MLP()
            ref.load_state_dict(state)
            grab = [m.register_forward_hook(_keeper(true_grads)) for m in ref.modules()]
            (loss_fn(ref(x), y) * loss_mul).backward()
            for h in grab:
                h.remove()
            for g in true_grads:
                a, b = fp16_lost(g * scale)
                inside[0] += a
                inside[1] += b
            needed.append(needed_scale_log2(true_grads))
    k = None if None in needed or not needed else max(n for n in needed if n is not None)
    fractions = {
        "boundary_lost_fraction": lost[0] / lost[1],
        "activation_grad_subnormal_fraction": inside[0] / inside[1] if inside[1] else 0.0,
        "param_grad_subnormal_fraction": params[0] / params[1] if params[1] else 0.0,
    }
    measured = {
        **fractions,
        "underflow_fraction": max(fractions.values()),
        "param_grad_zero_fraction": zero[0] / zero[1] if zero[1] else None,
        "needed_scale_log2": k,
    }
    return session_of(d), measured


def _keeper(into: list[torch.Tensor]) -> Any:
    """A forward hook that keeps the gradient entering the module (its output's gradient)."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        output.register_hook(lambda g: into.append(g.detach()))

    return hook


def underflow_expect(measured: dict[str, Any], tol: float = 0.03) -> Expect:
    """fp16-grad-underflow naming the measured lost share and the needed init_scale."""
    k = measured["needed_scale_log2"]
    ev: dict[str, tuple[Any, float]] = {
        key: (measured[key], tol)
        for key in (
            "underflow_fraction",
            "boundary_lost_fraction",
            "activation_grad_subnormal_fraction",
            "param_grad_subnormal_fraction",
        )
    }
    # Parameter gradients: ampdiag reads a sample (runs of 16, 1024 values per tensor) of
    # the sampled steps; the truth counts every value of every step.
    ev["param_grad_subnormal_fraction"] = (measured["param_grad_subnormal_fraction"], 0.06)
    ev["scale_reaches_target"] = (k is not None, 0.0)
    if k is not None:
        ev["recommended_init_scale"] = (2.0**k, 0.0)
    return Expect("fp16-grad-underflow", evidence=ev)


def truth(measured: dict[str, Any], *more: Expect, forbid: set[str] | None = None) -> Truth:
    return Truth(
        expect=[underflow_expect(measured), *more], forbid=forbid or set(), measured=measured
    )
