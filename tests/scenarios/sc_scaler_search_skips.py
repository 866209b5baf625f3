"""A GradScaler that starts too high (init_scale 2^24, FP16 autocast): its first steps'
gradients overflow and are skipped while it halves its scale, then training proceeds.

That is the scaler searching its scale, not a fault: skipped-steps must count the skips, and
nonfinite-origin must stay silent (the skips do not persist), as must loss-scale-collapse.

Truth, without ampdiag: the loop counts the skipped steps itself (the weights did not move)
and asserts they are a few leading steps, followed by steps that did update.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS = 16


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        setup = models.make("mlp")
        model = setup.model
        data = models.batches(setup, STEPS)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
        skipped: list[int] = []
        scales: list[float] = []
        before: list[torch.Tensor] = []

        def step_hook(step: int) -> None:
            if before and all(
                torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
            ):
                skipped.append(step - 1)
            before[:] = [p.detach().clone() for p in model.parameters()]
            scales.append(scaler.get_scale())

        with diagnose(out) as d:
            models.train(model, data, dtype=torch.float16, scaler=scaler, step_hook=step_hook)
            step_hook(len(data))
    # a search: a few leading skips, then every step updates the weights
    assert 1 <= len(skipped) <= 8 and skipped == list(range(len(skipped))), skipped
    measured = {"skipped": skipped, "scale_initial": scales[0], "scale_final": scales[-1]}
    return session_of(d), Truth(
        expect=[
            Expect(
                "skipped-steps",
                evidence={"skipped": (len(skipped), 0), "steps": (STEPS, 0)},
            )
        ],
        forbid={"nonfinite-origin", "loss-scale-collapse"},
        measured=measured,
    )


SCENARIO = Scenario(
    "scaler-search-skips",
    "A GradScaler starting at 2^24 skips its first few FP16 steps while it finds its scale.",
    run,
)
