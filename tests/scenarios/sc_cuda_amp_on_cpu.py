"""``torch.cuda.amp.autocast()`` and ``torch.cuda.amp.GradScaler()`` on a CPU model.

The pattern many AMP tutorials teach. Both are built for CUDA: on a CPU torch disables them
(with a warning), and the run trains in FP32 with a scaler that does nothing. Truth, measured
by the loop: a forward hook on each Linear records its output dtype (FP32 only), CPU autocast
was never enabled inside the loop's autocast block, and the scaler reports itself disabled.
The finding must name torch.cuda.amp as the cause and give the CPU's own autocast
(``torch.autocast("cpu", dtype=torch.bfloat16)``), not a generic "wrap the forward".

The healthy control: the same loop with ``torch.autocast("cpu", dtype=torch.bfloat16)`` and no
scaler -- no low-precision-inactive, nothing about torch.cuda.amp.
"""

from __future__ import annotations

import warnings
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


def _train(out: Path, cuda_amp: bool) -> tuple[Session, dict[str, object]]:
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        model = setup.model
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        seen: set[torch.dtype] = set()
        enabled: set[bool] = set()
        active = [True]  # the loop's forwards only (not the speed probe's copies at the exit)
        handles = [
            m.register_forward_hook(lambda _m, _i, o: seen.add(o.dtype) if active[0] else None)
            for m in linears
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that it disables both
            scaler = torch.cuda.amp.GradScaler() if cuda_amp else None
            try:
                with diagnose(out) as d:
                    for x, y in data:
                        opt.zero_grad(set_to_none=True)
                        ctx = (
                            torch.cuda.amp.autocast()
                            if cuda_amp
                            else torch.autocast("cpu", dtype=torch.bfloat16)
                        )
                        with ctx:
                            enabled.add(torch.is_autocast_enabled("cpu"))
                            loss = models.loss_of(model(x), y)
                        if scaler is not None:
                            scaler.scale(loss).backward()
                            scaler.step(opt)
                            scaler.update()
                        else:
                            loss.backward()
                            opt.step()
                    active[0] = False
            finally:
                for h in handles:
                    h.remove()
    measured: dict[str, object] = {
        "output_dtypes": sorted(map(str, seen)),
        "cpu_autocast_enabled": sorted(enabled),
        "scaler_enabled": scaler.is_enabled() if scaler is not None else None,
    }
    return session_of(d), measured


def _names_cuda_amp(session: Session) -> str | None:
    f = next((f for f in session.findings if f.id == "low-precision-inactive"), None)
    if f is None:
        return "no low-precision-inactive"
    if "torch.cuda.amp" not in f.title or "built for CUDA" not in f.title:
        return f"title does not name torch.cuda.amp: {f.title}"
    if "torch.autocast(device_type='cpu', dtype=torch.bfloat16)" not in f.fix:
        return f"fix is not the CPU's autocast: {f.fix}"
    return None


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = _train(out, cuda_amp=True)
    assert measured["output_dtypes"] == ["torch.float32"], measured
    assert measured["cpu_autocast_enabled"] == [False] and measured["scaler_enabled"] is False
    return session, Truth(
        expect=[Expect("low-precision-inactive", evidence={"matmul_fp32_share": (1.0, 1e-4)})],
        checks={"low-precision-inactive": _names_cuda_amp},
        measured=measured,
    )


def run_healthy(out: Path) -> tuple[Session, Truth]:
    session, measured = _train(out, cuda_amp=False)
    assert measured["output_dtypes"] == ["torch.bfloat16"], measured
    assert measured["cpu_autocast_enabled"] == [True]
    return session, Truth(forbid=set(HEALTHY_FORBID), measured=measured)


SCENARIOS = [
    Scenario(
        "cuda-amp-on-cpu",
        "torch.cuda.amp's autocast and GradScaler on a CPU model: both disabled, FP32 run.",
        run,
    ),
    Scenario(
        "cuda-amp-on-cpu-healthy",
        "The same loop with torch.autocast('cpu', bfloat16): no finding about autocast.",
        run_healthy,
        forbid=HEALTHY_FORBID,
    ),
]
