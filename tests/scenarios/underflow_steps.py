"""FP16 underflow measured step by step: gradients whose magnitude changes during the run.

The loop measures its own truth on every step, without ampdiag: before each backward it keeps
the step's weights, batch, loss multiplier and loss scale; after the run an FP32 replay of each
step (a fresh model loaded with that step's weights, no autocast, same batch) gives the true
gradient entering every module (a tensor hook on every module's output). From them:

* per step, the smallest power-of-two loss scale that keeps FP16's loss under 1%
  (`harness.needed_scale_log2`) of that step's true gradients;
* the init_scale ampdiag must recommend: the largest of those over the steps ampdiag samples
  (its documented schedule, `ampdiag.config.is_sampled_step`), and the step that needs it;
* per module, and over all modules, the share of nonzero true gradient values that FP16 holds
  as zero or subnormal at the scale in use (`harness.fp16_lost`), over the sampled steps.
"""

from __future__ import annotations

import copy
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


def run_schedule(
    out: Path,
    arch: str,
    steps: int,
    loss_mul: Callable[[int], float],
    init_scale: float | None,
    *,
    batch_size: int = 16,
    **settings: Any,
) -> tuple[Session, dict[str, Any]]:
    """Trains ``arch`` in FP16 autocast with the loss multiplied by ``loss_mul(step)`` (a
    GradScaler of fixed scale ``init_scale``, or none) and measures the truth (module doc)."""
    with seeded(0):
        setup = models.make(arch, batch_size=batch_size)
        data = models.batches(setup, steps)
        scaler = (
            torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**6)
            if init_scale is not None
            else None
        )
        current = [0]

        def loss_fn(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return models.loss_of(o, y) * loss_mul(current[0])

        kept: list[tuple[int, dict[str, torch.Tensor], models.Batch, float]] = []

        def step_hook(step: int) -> None:
            current[0] = step

        def before_backward(step: int, o: torch.Tensor, loss: torch.Tensor, b: Any) -> None:
            state = {k: v.detach().clone() for k, v in setup.model.state_dict().items()}
            scale = scaler.get_scale() if scaler is not None else 1.0
            kept.append((step, state, b, scale))

        with diagnose(out, **settings) as d:
            models.train(
                setup.model,
                data,
                dtype=torch.float16,
                scaler=scaler,
                loss_fn=loss_fn,
                before_backward=before_backward,
                step_hook=step_hook,
            )
        config = DiagnoseConfig(**{k: v for k, v in settings.items() if k == "sample_every"})
        reference = copy.deepcopy(setup.model)
        # the session's names: the root module is "(ClassName)"
        names = {id(m): n or f"({type(m).__name__})" for n, m in reference.named_modules()}
        per_step: list[dict[str, Any]] = []
        lost: dict[str, list[int]] = {}
        for step, state, (x, y), scale in kept:  # the FP32 replays, outside ampdiag's view
            reference.load_state_dict(state)
            grads: dict[str, torch.Tensor] = {}
            hooks = [m.register_forward_hook(_keeper(names, grads)) for m in reference.modules()]
            with torch.random.fork_rng(devices=[]):
                o = reference(x)
            (models.loss_of(o, y) * loss_mul(step)).backward()
            for h in hooks:
                h.remove()
            k = needed_scale_log2(grads.values())
            sampled = is_sampled_step(config, step)
            per_step.append({"step": step, "needed_scale_log2": k, "sampled": sampled})
            if sampled:
                for name, g in grads.items():
                    a, b = fp16_lost(g * scale)
                    acc = lost.setdefault(name, [0, 0])
                    acc[0] += a
                    acc[1] += b
    sampled_steps = [s for s in per_step if s["sampled"]]
    unreachable = [s for s in sampled_steps if s["needed_scale_log2"] is None]
    worst = max(
        (s for s in sampled_steps if s["needed_scale_log2"] is not None),
        key=lambda s: s["needed_scale_log2"],
        default=None,
    )
    total = [sum(v[0] for v in lost.values()), sum(v[1] for v in lost.values())]
    measured = {
        "per_step": per_step,
        "needed_scale_log2": worst["needed_scale_log2"] if worst and not unreachable else None,
        "needed_at_step": worst["step"] if worst and not unreachable else None,
        "activation_lost_fraction": total[0] / total[1] if total[1] else 0.0,
        "module_lost_fraction": {n: a / b for n, (a, b) in lost.items() if b},
    }
    return session_of(d), measured


def _keeper(names: dict[int, str], into: dict[str, torch.Tensor]) -> Any:
    """A forward hook that keeps the gradient entering each module, by module name."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        t = output[0] if isinstance(output, tuple) else output
        if isinstance(t, torch.Tensor) and t.requires_grad:
            name = names[id(module)]
            t.register_hook(lambda g: into.__setitem__(name, g.detach()))

    return hook


def underflow_expect(measured: dict[str, Any], tol: float = 0.03) -> Expect:
    """fp16-grad-underflow naming the measured shares, the worst modules, and the init_scale
    the worst sampled step needs (with that step, where only one step needs it)."""
    k = measured["needed_scale_log2"]
    per_module = measured["module_lost_fraction"]
    ranked = sorted(per_module.items(), key=lambda kv: -kv[1])
    ev: dict[str, tuple[Any, float]] = {
        "activation_grad_subnormal_fraction": (measured["activation_lost_fraction"], tol),
        "worst_module_fraction": (ranked[0][1], tol),
        # the three modules that lose most, each within the tolerance
        "module_lost_fraction": (dict(ranked[:3]), tol),
        "scale_reaches_target": (k is not None, 0.0),
    }
    distinct = sorted({round(v, 6) for v in per_module.values()}, reverse=True)
    if len(distinct) < 2 or distinct[0] - distinct[1] > 2 * tol:  # a clear worst module
        ev["worst_module"] = (ranked[0][0], 0.0)
    if k is not None:
        ev["recommended_init_scale"] = (2.0**k, 0.0)
        needing = [
            s["step"] for s in measured["per_step"] if s["sampled"] and s["needed_scale_log2"] == k
        ]
        if len(needing) == 1:
            ev["recommended_at_step"] = (needing[0], 0.0)
    return Expect("fp16-grad-underflow", evidence=ev)


def no_scaler_truth(measured: dict[str, Any]) -> Truth:
    """An FP16 run without a GradScaler: the underflow the replay measured, the scaler missing
    with the init_scale the worst sampled step needs, and no overflow or inf/NaN claimed."""
    k = measured["needed_scale_log2"]
    return Truth(
        expect=[
            underflow_expect(measured),
            Expect("grad-scaler-missing", evidence={"recommended_init_scale": (2.0**k, 0.0)}),
        ],
        forbid={"nonfinite-origin", "activation-overflow"},
        measured=measured,
    )
