"""FP16 range faults: a module whose output comes near or beyond FP16's max, and a backward
that overflows on every step so the GradScaler skips every step and its scale collapses.

Truth, measured by the loop: each module's largest |output| (own forward hooks), the steps the
optimizer really skipped (the weights did not move), and the scale before and after each
step (``scaler.get_scale()``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of


class Gain(nn.Module):
    """Multiplies by a constant: an activation that grows out of FP16's range."""

    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


class _InfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class InfGrad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _InfGrad.apply(x)  # type: ignore[no-untyped-call,no-any-return]


def _model_with(module: nn.Module) -> tuple[models.Setup, str]:
    setup = models.make("mlp")
    assert isinstance(setup.model, models.MLP)
    setup.model.body.insert(2, module)
    name = next(n for n, m in setup.model.named_modules() if m is module)
    return setup, name


def run_activation(out: Path, gain: float) -> tuple[Session, Truth]:
    with seeded(0):
        setup, _ = _model_with(Gain(gain))
        data = models.batches(setup, 6)
        peak: dict[str, float] = {}
        names = {id(m): n for n, m in setup.model.named_modules()}

        def record(m: nn.Module, a: Any, o: torch.Tensor) -> None:
            v = float(o.detach().float().abs().max())
            peak[names[id(m)]] = max(peak.get(names[id(m)], 0.0), v)

        handles = [m.register_forward_hook(record) for m in setup.model.modules()]
        scaler = torch.amp.GradScaler("cpu")
        with diagnose(out) as d:
            models.train(setup.model, data, dtype=torch.float16, scaler=scaler)
            for h in handles:
                h.remove()
    top = max(v for k, v in peak.items() if k)
    # The innermost module with the largest output: containers repeat a child's output.
    first = max((k for k in peak if k and peak[k] == top), key=lambda k: k.count("."))
    measured = {"module": first, "max_abs": peak[first]}
    if peak[first] == float("inf"):
        # An output that overflowed to inf: the origin finding names it (activation-overflow
        # is for finite peaks near the limit).
        expect = [
            Expect("nonfinite-origin", module=first, step=0, evidence={"phase": ("forward", 0)}),
        ]
    else:
        expect = [
            Expect(
                "activation-overflow",
                module=first,
                evidence={"max_abs": (peak[first], peak[first] * 1e-3)},
            )
        ]
    return session_of(d), Truth(
        expect=expect,
        forbid={"nonfinite-origin"}
        if not any(e.id == "nonfinite-origin" for e in expect)
        else set(),
        measured=measured,
    )


def run_activation_bf16(out: Path, gain: float) -> tuple[Session, Truth]:
    """BF16 (FP32's range) holds an activation past FP16's max: a what-if, not the run's fault."""
    with seeded(0):
        setup, name = _model_with(Gain(gain))
        data = models.batches(setup, 6)
        peak: list[float] = []
        losses: list[float] = []
        module = dict(setup.model.named_modules())[name]
        handle = module.register_forward_hook(
            lambda m, a, o: peak.append(float(o.detach().float().abs().max()))
        )
        with diagnose(out) as d:
            models.train(
                setup.model,
                data,
                dtype=torch.bfloat16,
                lr=1e-6,  # small enough that the gain's large gradients do not diverge it
                loss_fn=lambda o, y: _record(losses, models.loss_of(o, y)),
            )
            handle.remove()
    nonfinite = sum(not torch.isfinite(torch.tensor(v)) for v in losses)
    assert nonfinite == 0 and max(peak) > 65504.0, (nonfinite, max(peak))
    return session_of(d), Truth(
        expect=[Expect("activation-overflow", module=name, severities=frozenset({"info"}))],
        forbid={"nonfinite-origin", "skipped-steps", "loss-scale-collapse", "fp16-grad-underflow"},
        measured={"module": name, "max_abs": max(peak), "nonfinite_losses": nonfinite},
    )


def _record(losses: list[float], loss: torch.Tensor) -> torch.Tensor:
    losses.append(float(loss.detach().float()))
    return loss


def run_collapse(out: Path) -> tuple[Session, Truth]:
    """inf in the backward on every step: every step skipped, the scale halves each time."""
    with seeded(0):
        setup, _ = _model_with(InfGrad())
        data = models.batches(setup, 20)
        scaler = torch.amp.GradScaler("cpu")
        skipped: list[int] = []
        scales: list[float] = []
        before: list[torch.Tensor] = []

        def step_hook(step: int) -> None:
            if before and all(
                torch.equal(a, b) for a, b in zip(before, setup.model.parameters(), strict=True)
            ):
                skipped.append(step - 1)
            before[:] = [p.detach().clone() for p in setup.model.parameters()]
            scales.append(scaler.get_scale())

        with diagnose(out) as d:
            models.train(setup.model, data, dtype=torch.float16, scaler=scaler, step_hook=step_hook)
            step_hook(len(data))
    measured = {"skipped": skipped, "scale_initial": scales[0], "scale_min": min(scales)}
    return session_of(d), Truth(
        expect=[
            Expect(
                "skipped-steps",
                evidence={"skipped": (len(skipped), 0), "steps": (len(data), 0)},
            ),
            Expect(
                "loss-scale-collapse",
                evidence={"scale_initial": (scales[0], 0), "scale_min": (min(scales), 0)},
            ),
        ],
        measured=measured,
    )


SCENARIOS = [
    Scenario(
        "activation-near-fp16-max",
        "An FP16 activation x 2e4 reaches ~4e4: within 4x of FP16's max.",
        lambda out: run_activation(out, 2e4),
    ),
    Scenario(
        "activation-overflow-fp16",
        "An FP16 activation x 1e5 overflows to inf at step 0.",
        lambda out: run_activation(out, 1e5),
    ),
    Scenario(
        "activation-whatif-bf16",
        "A BF16 activation x 1e5 exceeds FP16's max but is finite in BF16: only a what-if.",
        lambda out: run_activation_bf16(out, 1e5),
    ),
    Scenario(
        "loss-scale-collapse",
        "inf in the backward on every step: the scaler skips all, the scale collapses.",
        run_collapse,
    ),
]
