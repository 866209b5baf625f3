"""Adam on FP16 weights (``model.half()``): ``eps=1e-8`` is 0 in FP16, so 0/0.

The scenarios' MLP stored in FP16 with ``torch.optim.Adam`` (its state FP16 too) and a small
loss: a gradient whose square underflows FP16 leaves ``exp_avg_sq`` at 0, the denominator
``sqrt(0) + eps`` is 0 (1e-8 rounds to 0 in FP16), and the update is 0/0. The truth is
measured without ampdiag: the step after which a weight is first non-finite while that step's
loss and gradients were finite; that ``1e-8`` is 0 in FP16; and that the same loop with FP32
weights stays finite. The control is the same FP16 loop with ``eps=1e-4`` (FP16 holds it):
finite throughout (measured), no divergence.

Expected: ``diverged`` with cause ``precision`` (the update of the FP16 weights, not a batch:
a replay from NaN weights proves nothing) and ``low-precision-params`` high, naming the step
the update broke the weights before.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.divergence import cause_is
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of
from tests.scenarios.sc_diverge_fp16_params_tied import no_unfounded_not_precision

STEPS = 8
LOSS_MUL = 1e-3


def _loop(
    dtype: torch.dtype, eps: float, out: Path | None = None
) -> tuple[list[float], int | None, bool, Session | None]:
    """The loop: its losses, the first step whose update made a weight non-finite (its loss
    and gradients finite), whether every step's loss was finite."""
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        model = setup.model.to(dtype)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=eps)
        broke: list[int] = []

        def loop() -> list[float]:
            losses = []
            for step, (x, y) in enumerate(data):
                loss = models.loss_of(model(x.to(dtype)).float(), y) * LOSS_MUL
                opt.zero_grad(set_to_none=True)
                loss.backward()
                grads_ok = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
                opt.step()
                weights_ok = all(bool(torch.isfinite(p).all()) for p in model.parameters())
                if math.isfinite(float(loss)) and grads_ok and not weights_ok and not broke:
                    broke.append(step)
                losses.append(float(loss.detach()))
            return losses

        if out is None:
            losses = loop()
            return losses, (broke or [None])[0], all(map(math.isfinite, losses)), None
        with diagnose(out) as d:
            losses = loop()
    return losses, (broke or [None])[0], all(map(math.isfinite, losses)), session_of(d)


def run(out: Path) -> tuple[Session, Truth]:
    _, _, fp32_finite, _ = _loop(torch.float32, 1e-8)
    losses, broke, _, _ = _loop(torch.float16, 1e-8)
    watched, _, _, session = _loop(torch.float16, 1e-8, out)
    assert session is not None
    measured = {
        "eps_1e-8_in_fp16": float(torch.tensor(1e-8, dtype=torch.float16)),
        "update_broke_weights_at_step": broke,
        "fp32_weights_finite": fp32_finite,
        "bit_identical": [str(v) for v in watched] == [str(v) for v in losses],
    }
    assert measured["eps_1e-8_in_fp16"] == 0.0 and broke is not None and fp32_finite, measured
    assert measured["bit_identical"], "diagnose() changed the training"
    return session, Truth(
        expect=[
            Expect(
                "diverged",
                step=broke + 1,
                evidence={"cause": ("precision", 0.0)},
                severities=frozenset({"high"}),
            ),
            Expect(
                "low-precision-params",
                evidence={"update_made_nonfinite_before_step": (broke + 1, 0)},
                severities=frozenset({"high"}),
            ),
        ],
        measured=measured,
        checks={
            "divergence-cause": cause_is("precision"),
            "no-unfounded-not-precision": no_unfounded_not_precision,
        },
    )


def run_control(out: Path) -> tuple[Session, Truth]:
    _, broke, finite, session = _loop(torch.float16, 1e-4, out)
    assert session is not None
    assert broke is None and finite, (broke, finite)
    return session, Truth(
        forbid={"diverged", "stalled", "nonfinite-origin"},
        measured={"finite": finite},
    )


SCENARIOS = [
    Scenario(
        "adam-eps-fp16-weights",
        "model.half() + Adam(eps=1e-8): eps is 0 in FP16, the update is 0/0.",
        run,
    ),
    Scenario(
        "adam-eps-fp16-control",
        "The same FP16 loop with eps=1e-4 (FP16 holds it): finite, no divergence.",
        run_control,
    ),
]
