"""A GradScaler that skips (or underflows) by its own settings, told apart from a model
that overflows.

A growth_factor of 256 every 3 steps overshoots by 8 halvings each time: skips, named
``grad-scaler-config`` with its growth_factor. A scale fixed tiny (``init_scale=2**-20,
growth_interval=10**6``) was measured to skip nothing and flush the gradients to zero: it is
``fp16-grad-underflow`` naming the growth_interval that holds it, never a collapse or skips.

The scenarios' MLP in FP16 autocast with ``GradScaler(init_scale=2**14, growth_interval=1)``:
the scale doubles every finite step until the scaled gradients overflow, backs off, and grows
again the next step. The truth is measured without ampdiag: a step is skipped when the
optimizer step left every weight unchanged (weights copied after the backward, compared at the
next step). The same model and batches with the default ``growth_interval`` (2000) is the
control, measured the same way: it skips (almost) nothing. The settings, not FP16, are the
cause: ``grad-scaler-config`` with the measured skip count, and no layer blamed
(``nonfinite-origin``), no ``skipped-steps`` pointing at an overflow, no FP32 advice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS = 26
INIT_SCALE = 2.0**14


def skipped_run(out: Path, probe: bool = True, **settings: Any) -> tuple[Session, int, float]:
    """The MLP's FP16 loop with a GradScaler of ``settings`` under diagnose(); the steps whose
    optimizer step left every weight unchanged, and the share of parameter-gradient values
    that are exactly 0 (both counted by the scenario itself).

    ``probe=False``: no precision A/B. On a CPU where this MLP's FP32 is about 1.1x FP16's
    speed, a measured ``prefer-fp32`` (a speed claim, the switch that makes the scaler moot)
    came and went with the load; the scaler-setting scenarios assert the settings' diagnosis,
    and forbid FP32 advice as a cure for the skips."""
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        scaler = torch.amp.GradScaler("cpu", **{"init_scale": INIT_SCALE, **settings})
        kept: list[list[torch.Tensor]] = []
        skipped: list[int] = []
        zeros = [0, 0]  # zero values, all values

        def after_backward(step: int) -> None:
            kept[:] = [[p.detach().clone() for p in setup.model.parameters()]]
            for p in setup.model.parameters():
                if p.grad is not None:
                    zeros[0] += int((p.grad == 0).sum())
                    zeros[1] += p.grad.numel()

        def step_hook(step: int) -> None:
            if kept and all(
                torch.equal(a, b) for a, b in zip(kept[0], setup.model.parameters(), strict=True)
            ):
                skipped.append(step - 1)

        with diagnose(out, speed_probe=probe) as d:
            models.train(
                setup.model,
                data,
                dtype=torch.float16,
                scaler=scaler,
                after_backward=after_backward,
                step_hook=step_hook,
            )
            step_hook(STEPS)
    return session_of(d), len(skipped), zeros[0] / max(zeros[1], 1)


def run(out: Path) -> tuple[Session, Truth]:
    _, control, _ = skipped_run(out / "control")
    session, skips, _ = skipped_run(out / "interval-1", probe=False, growth_interval=1)
    measured = {"skipped_growth_interval_1": skips, "skipped_default_interval": control}
    assert skips >= 5 and control <= 1, measured
    return session, Truth(
        expect=[
            Expect(
                "grad-scaler-config",
                evidence={"skipped": (skips, 0), "growth_interval": (1, 0)},
                severities=frozenset({"medium", "high"}),
            )
        ],
        forbid={"nonfinite-origin", "skipped-steps", "stalled", "diverged", "prefer-fp32"},
        measured=measured,
    )


def run_growth_factor(out: Path) -> tuple[Session, Truth]:
    """growth_factor=256 every 3 steps: each growth overshoots by 8 halvings, each a skip."""
    _, control, _ = skipped_run(out / "factor-2", growth_interval=3)
    session, skips, _ = skipped_run(
        out / "factor-256", probe=False, growth_interval=3, growth_factor=256.0
    )
    measured = {"skipped_growth_factor_256": skips, "skipped_growth_factor_2": control}
    assert skips >= 4 * max(control, 1), measured
    return session, Truth(
        expect=[
            Expect(
                "grad-scaler-config",
                evidence={"skipped": (skips, 0), "growth_factor": (256.0, 0)},
                severities=frozenset({"medium", "high"}),
            )
        ],
        forbid={"nonfinite-origin", "skipped-steps", "stalled", "diverged", "prefer-fp32"},
        measured=measured,
    )


def run_fixed_tiny(out: Path) -> tuple[Session, Truth]:
    """A scale fixed at 2^-20 (growth_interval=10^6): it skips nothing, it underflows.

    Measured: no step skipped (every update changed the weights) and the share of parameter
    gradients that are exactly 0, against the same loop with torch's default scaler.
    """
    _, _, zero_default = skipped_run(out / "default", init_scale=2.0**16)
    session, skips, zero = skipped_run(
        out / "fixed-tiny", init_scale=2.0**-20, growth_interval=10**6
    )
    measured = {"skipped": skips, "zero_grad_share": zero, "zero_grad_share_default": zero_default}
    assert skips == 0 and zero > 0.9 and zero_default < 0.5, measured

    def named(session: Session) -> str | None:
        found = [f for f in session.all_findings() if f.id == "fp16-grad-underflow"]
        if not found or "growth_interval=2000" not in found[0].fix:
            return "fp16-grad-underflow's fix does not let the scale grow (growth_interval=2000)"
        return None

    return session, Truth(
        expect=[
            Expect(
                "fp16-grad-underflow",
                evidence={"scale_held_by": ({"growth_interval": 10**6}, 0)},
                severities=frozenset({"high"}),
            )
        ],
        checks={"fp16-grad-underflow": named},
        forbid={
            "loss-scale-collapse",
            "skipped-steps",
            "grad-scaler-config",
            "nonfinite-origin",
            "stalled",
            "diverged",
        },
        measured=measured,
    )


def run_control(out: Path) -> tuple[Session, Truth]:
    session, skips, _ = skipped_run(out)
    assert skips <= 1, skips
    return session, Truth(
        forbid={"grad-scaler-config", "nonfinite-origin", "stalled", "diverged"},
        measured={"skipped": skips},
    )


SCENARIOS = [
    Scenario(
        "scaler-config-growth-interval-1",
        "GradScaler(growth_interval=1) skips every other step by itself: its settings.",
        run,
    ),
    Scenario(
        "scaler-config-growth-factor-256",
        "GradScaler(growth_factor=256, growth_interval=3) overshoots and skips by itself.",
        run_growth_factor,
    ),
    Scenario(
        "scaler-fixed-tiny-scale",
        "A GradScaler fixed at 2^-20 (growth_interval=10^6): no skip, the gradients underflow.",
        run_fixed_tiny,
    ),
    Scenario(
        "scaler-config-default-control",
        "The same model with the default growth_interval: no skip, no scaler finding.",
        run_control,
    ),
]
