"""FP16 autocast without a GradScaler on the embedding + GRU model: autocast runs the embedding
in FP32 (an FP32-policy op), so the embedding's weight gets an FP32 gradient, and its small
values -- a quarter of them below 2^-14 -- are no FP16 subnormals: FP16 never held them.

Truth, measured without ampdiag: which parameters autocast casts to FP16
(`harness.fp16_cast_params`: a dispatch mode sees every cast to float16 in one forward of a
copy of the model), and on the sampled steps the share of the nonzero gradients of those parameters
that are below 2^-14 (scale 1, every value counted), with the same share over all
parameters, which must differ from it (else the scenario proves nothing).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampdiag.config import DiagnoseConfig, is_sampled_step
from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    Expect,
    Scenario,
    Truth,
    diagnose,
    fp16_cast_params,
    seeded,
    session_of,
)

STEPS = 6
#: Every value of every gradient is counted (the GRU's largest tensor holds 3 x 32 x 32).
SAMPLE = 1 << 16


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        setup = models.make("gru")
        data = models.batches(setup, STEPS)
        cast = fp16_cast_params(setup.model, data[0][0])
        config = DiagnoseConfig()
        counts = {"cast": [0, 0], "all": [0, 0]}

        def after_backward(step: int) -> None:
            if not is_sampled_step(config, step):
                return
            for name, p in setup.model.named_parameters():
                g = p.grad.detach().double()
                nz = g != 0
                sub = int((nz & (g.abs() < 2.0**-14)).sum())
                for key in ("cast", "all") if name in cast else ("all",):
                    counts[key][0] += sub
                    counts[key][1] += int(nz.sum())

        with diagnose(out, numerics_sample_elements=SAMPLE) as d:
            models.train(setup.model, data, dtype=torch.float16, after_backward=after_backward)
    fp16_share = counts["cast"][0] / counts["cast"][1]
    all_share = counts["all"][0] / counts["all"][1]
    assert cast and "embed.weight" not in cast and all_share - fp16_share > 0.02, counts
    measured = {
        "not_cast": sorted(n for n, _ in setup.model.named_parameters() if n not in cast),
        "param_grad_subnormal_fraction": fp16_share,
        "all_params_subnormal_fraction": all_share,
    }
    return session_of(d), Truth(
        expect=[
            Expect(
                "fp16-grad-underflow",
                evidence={"param_grad_subnormal_fraction": (fp16_share, 0.01)},
            )
        ],
        measured=measured,
    )


SCENARIO = Scenario(
    "underflow-fp32-param-grads",
    "FP16 autocast, embedding + GRU: the embedding's FP32 gradients are no FP16 subnormals.",
    run,
)
