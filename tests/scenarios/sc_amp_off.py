"""A deliberate FP32 run: no autocast, no GradScaler -> ``amp-off`` (info), nothing else.

Truth, measured by the loop itself: it never enters ``torch.autocast`` and never makes a
GradScaler (by construction), every parameter and every Linear output it sees is FP32 (a
forward hook on each Linear records the output dtypes), and the matmul FLOPs of the audited
step are counted from the layer shapes (``2 * batch * in * out`` per Linear in the forward,
twice that in the backward, less the first layer's input gradient, which nothing needs).
``amp-off`` must say 100% of them ran in FP32 and give that FLOP count; no misuse or numerics
finding may fire (the run is healthy).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    HEALTHY_FORBID,
    Expect,
    Scenario,
    Truth,
    diagnose,
    seeded,
    session_of,
)

STEPS = 6


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        model = setup.model
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        seen: set[torch.dtype] = set()
        handles = [m.register_forward_hook(lambda _m, _i, o: seen.add(o.dtype)) for m in linears]
        try:
            with diagnose(out) as d:
                for x, y in data:
                    opt.zero_grad(set_to_none=True)
                    loss = models.loss_of(model(x), y)
                    loss.backward()
                    opt.step()
        finally:
            for h in handles:
                h.remove()
    batch = data[0][0].shape[0]
    forward = [2 * batch * m.in_features * m.out_features for m in linears]
    # backward: the weight gradient of every Linear, the input gradient of all but the first
    flops = sum(forward) + sum(forward) + sum(forward[1:])
    assert seen == {torch.float32}, seen
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return session_of(d), Truth(
        expect=[
            Expect(
                "amp-off",
                evidence={"matmul_fp32_share": (1.0, 1e-4), "matmul_fp32_flops": (flops, 0)},
            )
        ],
        forbid=set(HEALTHY_FORBID),
        measured={"output_dtypes": sorted(map(str, seen)), "matmul_flops": flops},
    )


SCENARIO = Scenario(
    "amp-off-fp32",
    "A deliberate FP32 MLP run: amp-off (info) with the FP32 share and FLOPs, nothing else.",
    run,
    forbid=HEALTHY_FORBID,
)
