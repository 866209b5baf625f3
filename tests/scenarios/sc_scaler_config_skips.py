"""A GradScaler that skips by its own settings, told apart from a model that overflows.

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


def skipped_run(out: Path, **settings: Any) -> tuple[Session, int]:
    """The MLP's FP16 loop with a GradScaler of ``settings`` under diagnose(); the steps whose
    optimizer step left every weight unchanged (counted by the scenario itself)."""
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, **settings)
        kept: list[list[torch.Tensor]] = []
        skipped: list[int] = []

        def after_backward(step: int) -> None:
            kept[:] = [[p.detach().clone() for p in setup.model.parameters()]]

        def step_hook(step: int) -> None:
            if kept and all(
                torch.equal(a, b) for a, b in zip(kept[0], setup.model.parameters(), strict=True)
            ):
                skipped.append(step - 1)

        with diagnose(out) as d:
            models.train(
                setup.model,
                data,
                dtype=torch.float16,
                scaler=scaler,
                after_backward=after_backward,
                step_hook=step_hook,
            )
            step_hook(STEPS)
    return session_of(d), len(skipped)


def run(out: Path) -> tuple[Session, Truth]:
    _, control = skipped_run(out / "control")
    session, skips = skipped_run(out / "interval-1", growth_interval=1)
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


def run_control(out: Path) -> tuple[Session, Truth]:
    session, skips = skipped_run(out)
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
        "scaler-config-default-control",
        "The same model with the default growth_interval: no skip, no scaler finding.",
        run_control,
    ),
]
