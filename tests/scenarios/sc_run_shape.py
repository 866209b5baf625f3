"""Faults in the run's shape rather than its numbers: a block too short for the profiler's
schedule, and a block that dies of an out-of-memory error.

Truth, from the loop: how many steps it ran against the schedule it asked for; the error it
raised itself (a ``torch.OutOfMemoryError`` at a known step).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of


def run_too_short(out: Path) -> tuple[Session, Truth]:
    skip, warmup = 1, 1
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, 2)
        with diagnose(out, profile_skip=skip, profile_warmup=warmup) as d:
            models.train(setup.model, data, dtype=torch.bfloat16)
    need = skip + warmup + 1
    assert len(data) < need
    return session_of(d), Truth(
        expect=[
            Expect(
                "profiler-no-steps",
                evidence={"steps_seen": (len(data), 0), "steps_needed": (need, 0)},
            )
        ],
        measured={"steps": len(data), "needed": need},
    )


def run_oom(out: Path) -> tuple[Session, Truth]:
    at = 3
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, 6)

        def step_hook(step: int) -> None:
            if step == at:
                raise torch.OutOfMemoryError("CPU out of memory (raised by the scenario)")

        d = diagnose(out)
        with pytest.raises(torch.OutOfMemoryError), d:
            models.train(setup.model, data, dtype=torch.bfloat16, step_hook=step_hook)
    return session_of(d), Truth(
        expect=[Expect("out-of-memory")],
        forbid={"nonfinite-origin", "prefer-bf16"},
        measured={"raised_at_step": at},
    )


SCENARIOS = [
    Scenario("profiler-too-short", "2 steps; the profiler needs 3.", run_too_short),
    Scenario("out-of-memory", "OutOfMemoryError at step 3.", run_oom, status="error"),
]
