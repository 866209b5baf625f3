"""A loop that forgets ``optimizer.zero_grad()``: each step applies the sum of all earlier
gradients.

The scenarios' MLP in BF16 autocast with SGD; the loop never clears the gradients. The truth
is measured without ampdiag: before each backward the scenario compares every parameter's
gradient with the one the previous optimizer step used (same values: nothing cleared them).
The control is the same loop with ``zero_grad()`` before each backward,
and one with two micro-batches per step (accumulation, cleared per step): no finding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS = 8


def _loop(out: Path, clear: bool, micro: int = 1) -> tuple[Session, int, int]:
    """Trains; returns the session, the backwards that began with the previous step's
    gradients still in place (equal values), and the backwards checked."""
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS * micro)
        model = setup.model
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        last: list[torch.Tensor | None] = []
        stale = checked = 0
        with diagnose(out) as d:
            for step in range(STEPS):
                if clear:
                    opt.zero_grad(set_to_none=True)
                for k in range(micro):
                    x, y = data[step * micro + k]
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        o = model(x)
                    loss = models.loss_of(o.float(), y) / micro
                    if k == 0 and last:
                        checked += 1
                        now = [p.grad for p in model.parameters()]
                        stale += all(
                            a is not None and b is not None and torch.equal(a, b)
                            for a, b in zip(now, last, strict=True)
                        )
                    loss.backward()
                opt.step()
                last = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    return session_of(d), stale, checked


def run(out: Path) -> tuple[Session, Truth]:
    session, stale, checked = _loop(out, clear=False)
    assert stale == checked == STEPS - 1, (stale, checked)
    return session, Truth(
        expect=[
            Expect(
                "grads-not-zeroed",
                evidence={"not_cleared": (stale, 0), "checked": (checked, 0)},
                severities=frozenset({"high"}),
            )
        ],
        measured={"backwards_on_uncleared_gradients": stale, "checked": checked},
    )


def run_control(out: Path) -> tuple[Session, Truth]:
    session, stale, checked = _loop(out, clear=True, micro=2)
    assert stale == 0 and checked == STEPS - 1, (stale, checked)
    return session, Truth(
        forbid={"grads-not-zeroed", "grad-accumulation-broken"},
        measured={"backwards_on_uncleared_gradients": stale},
    )


SCENARIOS = [
    Scenario("grads-not-zeroed", "The loop never calls optimizer.zero_grad().", run),
    Scenario(
        "grads-zeroed-accumulation-control",
        "zero_grad() once per step of two micro-batches: no finding.",
        run_control,
    ),
]
