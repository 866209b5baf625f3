"""Healthy controls: four architectures x {bf16, fp16 + GradScaler}, trained correctly.

Truth: the run is correct by construction, and the scenario checks it itself: every loss is
finite, no gradient is non-finite, and (FP16) the GradScaler skipped no step and FP16 loses
under 1% of the gradient values entering it (counted against the FP32 gradient at the
autocast boundary). No numerics or misuse finding may appear, and precision advice only
from the measured A/B (BF16 is much faster than FP16 on a CPU), never for the run's own dtype.
Default settings (only the outputs nobody reads are off).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    HEALTHY_FORBID,
    Scenario,
    Truth,
    diagnose,
    fp16_lost,
    measured_precision_advice,
    seeded,
    session_of,
)

ARCHS = ("mlp", "cnn", "transformer", "gru")
STEPS = 8


def _runner(arch: str, dtype: torch.dtype):
    def run(out: Path) -> tuple[Session, Truth]:
        with seeded(0):
            setup = models.make(arch)
            data = models.batches(setup, STEPS)
            scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
            lost = [0, 0]
            finite = [True]

            def check(
                step: int, out_: torch.Tensor, loss: torch.Tensor, batch: models.Batch
            ) -> None:
                finite[0] &= bool(torch.isfinite(loss))
                if scaler is not None:
                    o = out_.detach().float().requires_grad_()
                    (g,) = torch.autograd.grad(models.loss_of(o, batch[1]), o)
                    a, b = fp16_lost(g * scaler.get_scale())
                    lost[0] += a
                    lost[1] += b

            with diagnose(out) as d:
                models.train(setup.model, data, dtype=dtype, scaler=scaler, before_backward=check)
        grads_finite = all(
            p.grad is None or bool(torch.isfinite(p.grad).all()) for p in setup.model.parameters()
        )
        measured = {
            "losses_finite": finite[0],
            "grads_finite": grads_finite,
            "boundary_lost_fraction": lost[0] / lost[1] if lost[1] else 0.0,
        }
        assert finite[0] and grads_finite, f"control is not healthy: {measured}"
        assert measured["boundary_lost_fraction"] < 0.01, measured
        precision = "fp16" if dtype == torch.float16 else "bf16"
        return session_of(d), Truth(
            measured=measured,
            checks={"precision-advice-measured": measured_precision_advice(precision)},
        )

    return run


SCENARIOS = [
    Scenario(
        name=f"healthy-{arch}-{'bf16' if dtype == torch.bfloat16 else 'fp16-scaler'}",
        description=f"A correct {arch} run in {dtype} (FP16 with a GradScaler).",
        run=_runner(arch, dtype),
        forbid=HEALTHY_FORBID,
    )
    for arch in ARCHS
    for dtype in (torch.bfloat16, torch.float16)
]
