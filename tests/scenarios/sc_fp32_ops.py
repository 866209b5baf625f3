"""BF16 autocast, but one 64x64 layer is run in FP32 on purpose (autocast disabled around it):
a third of the matmul FLOPs run in FP32.

Truth, from the layer shapes (no ampdiag): the matmul FLOPs of forward and backward, 2·m·n·k
per product -- forward, the weight gradient, and the input gradient where the input requires
grad (the first layer's does not) -- and the share of them in the FP32 layer.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

BATCH = 16


class FP32Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return super().forward(x.float())


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        setup = models.make("mlp", batch_size=BATCH)
        assert isinstance(setup.model, models.MLP)
        setup.model.body.insert(4, FP32Linear(64, 64))
        data = models.batches(setup, 4)
        with diagnose(out) as d:
            models.train(setup.model, data, dtype=torch.bfloat16)
    flops = {"low": 0, "fp32": 0}
    first = True
    for m in setup.model.modules():
        if isinstance(m, nn.Linear):
            products = 2 if first else 3  # forward, weight grad, input grad (not the first)
            f = products * 2 * BATCH * m.in_features * m.out_features
            flops["fp32" if isinstance(m, FP32Linear) else "low"] += f
            first = False
    share = flops["fp32"] / (flops["fp32"] + flops["low"])
    return session_of(d), Truth(
        expect=[Expect("fp32-ops-in-autocast", evidence={"fp32_flops_share": (share, 0.02)})],
        forbid={"low-precision-inactive", "prefer-bf16"},
        measured={"matmul_flops": flops, "fp32_share": share},
    )


SCENARIO = Scenario(
    "fp32-layer-in-autocast", "A 64x64 layer forced to FP32 inside BF16 autocast.", run
)
