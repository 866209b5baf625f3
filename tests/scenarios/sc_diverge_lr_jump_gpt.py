"""A learning rate far too high in nanoGPT's style: AdamW at lr 300 (or more) on the GPT, FP32.

The loss jumps from 4.4 to about 10^6 in one step and that same step's gradients are already
non-finite (nanoGPT's train.py at learning_rate=30 does the same: 4.2, 16626, NaN). Only one
finite loss precedes the first non-finite step, so no multi-step trend shows it: the jump is
the evidence. Truth without ampdiag: the same loop run again in FP32 and in BF16 records each
step's loss and the first step whose parameter gradients are non-finite; both diverge.

Where the gradients overflow depends on the CPU's kernels (on a Xeon with AVX512 the step after
lr 300 keeps finite gradients), so the learning rate is measured on the machine running the
scenario: the first of `LRS` whose FP32 loop has the loss jump in one step with that step's
gradients non-finite.

diverged (high), at that step, cause not-precision; its fix is the learning rate (lower it,
warm it up, clip), never "find the batch", and the fix shown for the merged nonfinite-origin
says the same, with no float32 advice; no precision recommendation among the high
findings (prefer-*, tune-grad-scaler, low-precision-inactive, autocast-slower).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.divergence import NO_PRECISION_ADVICE, cause_is, origin_fix_fits
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

#: Learning rates tried in turn: the first that makes the fault on this CPU is the scenario's.
LRS = (300.0, 3e3, 3e4, 3e5)
STEPS = 6
#: Recommendations to change the precision: none may be high on a run no precision fixes.
PRECISION_RECOMMENDATIONS = frozenset(
    {*NO_PRECISION_ADVICE, "low-precision-inactive", "autocast-slower"}
)


def _loop(
    dtype: torch.dtype | None, out: Path | None, lr: float
) -> tuple[list[float], list[int], Any]:
    with seeded(0):
        setup = models.make("gpt")
        data = models.batches(setup, STEPS)
        opt = torch.optim.AdamW(setup.model.parameters(), lr=lr)
        bad: list[int] = []

        def grads(step: int) -> None:
            ps = [p for p in setup.model.parameters() if p.grad is not None]
            if not all(bool(torch.isfinite(p.grad).all()) for p in ps):
                bad.append(step)

        def train() -> list[float]:
            return models.train(setup.model, data, dtype=dtype, optimizer=opt, after_backward=grads)

        if out is None:
            return train(), bad, None
        with diagnose(out) as d:
            losses = train()
    return losses, bad, d


def _jumps(losses: list[float], bad: list[int]) -> bool:
    """The fault: the second step's gradients non-finite, its loss finite and 1000x the first."""
    return bad[:1] == [1] and math.isfinite(losses[1]) and losses[1] > 1000 * abs(losses[0])


def run(out: Path) -> tuple[Session, Truth]:
    tried = {}
    for lr in LRS:
        fp32, bad32, _ = _loop(None, None, lr)
        tried[lr] = (bad32[:2], fp32[:2])
        if _jumps(fp32, bad32):
            break
    else:
        raise AssertionError(f"no learning rate makes the one-step jump on this CPU: {tried}")
    bf16, bad16, _ = _loop(torch.bfloat16, None, lr)
    losses, bad, d = _loop(None, out, lr)
    first = bad32[0]
    # the fault is real, and no precision's: both diverge, the loss jumped in one step
    assert bad16 and bad == bad32, (bad32, bad16, bad)
    assert losses[: first + 1] == fp32[: first + 1]  # diagnose() changed nothing

    def learning_rate_fix(s: Session) -> str | None:
        f = next((f for f in s.all_findings() if f.id == "diverged"), None)
        if f is None:
            return "diverged absent"
        if "learning rate" not in f.fix or "Find the batch" in f.fix:
            return f"the fix is not the learning rate: {f.fix!r}"
        high = [
            x.id for x in s.findings if x.severity == "high" and x.id in PRECISION_RECOMMENDATIONS
        ]
        return f"precision recommendations at high: {high}" if high else None

    return session_of(d), Truth(
        expect=[
            Expect(
                "diverged",
                step=first,
                evidence={"cause": ("not-precision", 0.0)},
                severities=frozenset({"high"}),
            )
        ],
        forbid=set(NO_PRECISION_ADVICE),
        measured={
            "lr": lr,
            "fp32_losses": fp32[:3],
            "bf16_losses": bf16[:3],
            "first_nonfinite": first,
        },
        checks={
            "divergence-cause": cause_is("not-precision"),
            "divergence-fix-learning-rate": learning_rate_fix,
            "origin-fix-fits": origin_fix_fits(lr=True),
        },
    )


SCENARIO = Scenario(
    "diverge-lr-jump-gpt",
    "AdamW at lr 300 (or more, measured) on the GPT (FP32): the loss jumps 10^5x in one step, "
    "its gradients non-finite in the same step, as in BF16.",
    run,
)
