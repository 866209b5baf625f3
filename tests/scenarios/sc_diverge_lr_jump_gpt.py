"""A learning rate far too high in nanoGPT's style: AdamW at lr 300 on the GPT, FP32.

The loss jumps from 4.4 to about 10^6 in one step and that same step's gradients are already
non-finite (nanoGPT's train.py at learning_rate=30 does the same: 4.2, 16626, NaN). Only one
finite loss precedes the first non-finite step, so no multi-step trend shows it: the jump is
the evidence. Truth without ampdiag: the same loop run again in FP32 and in BF16 records each
step's loss and the first step whose parameter gradients are non-finite; both diverge.

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

LR = 300.0
STEPS = 6
#: Recommendations to change the precision: none may be high on a run no precision fixes.
PRECISION_RECOMMENDATIONS = frozenset(
    {*NO_PRECISION_ADVICE, "low-precision-inactive", "autocast-slower"}
)


def _loop(dtype: torch.dtype | None, out: Path | None) -> tuple[list[float], list[int], Any]:
    with seeded(0):
        setup = models.make("gpt")
        data = models.batches(setup, STEPS)
        opt = torch.optim.AdamW(setup.model.parameters(), lr=LR)
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


def run(out: Path) -> tuple[Session, Truth]:
    fp32, bad32, _ = _loop(None, None)
    bf16, bad16, _ = _loop(torch.bfloat16, None)
    losses, bad, d = _loop(None, out)
    first = bad32[0]
    # the fault is real, and no precision's: both diverge, the loss jumped in one step
    assert bad16 and first == 1 and bad == bad32, (bad32, bad16, bad)
    assert math.isfinite(fp32[first]) and fp32[first] > 1000 * fp32[0], fp32
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
        measured={"fp32_losses": fp32[:3], "bf16_losses": bf16[:3], "first_nonfinite": first},
        checks={
            "divergence-cause": cause_is("not-precision"),
            "divergence-fix-learning-rate": learning_rate_fix,
            "origin-fix-fits": origin_fix_fits(lr=True),
        },
    )


SCENARIO = Scenario(
    "diverge-lr-jump-gpt",
    "AdamW at lr 300 on the GPT (FP32): the loss jumps 10^5x in one step, its gradients "
    "non-finite in the same step, as in BF16.",
    run,
)
