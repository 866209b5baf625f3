"""GradScaler and autocast misuse, one scenario each; every truth is measured by the loop
itself (what the scaler's state was, what the clip saw, which dtypes the model held or ran),
never read from ampdiag.

An MLP trained a few steps on the CPU in FP16 autocast (except where the misuse is the
dtype). Default settings, the unread outputs off.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS = 6


def _setup() -> tuple[models.Setup, list[models.Batch], torch.optim.Optimizer]:
    setup = models.make("mlp")
    return setup, models.batches(setup, STEPS), torch.optim.SGD(setup.model.parameters(), lr=0.05)


def run_disabled(out: Path) -> tuple[Session, Truth]:
    """GradScaler("cuda") on a CPU run: torch disables it (with only a warning)."""
    with seeded(0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setup, data, opt = _setup()
        scaler = torch.amp.GradScaler("cuda")
        with diagnose(out) as d:
            models.train(setup.model, data, dtype=torch.float16, scaler=scaler, optimizer=opt)
    enabled = scaler.is_enabled()
    assert not enabled
    return session_of(d), Truth(
        expect=[Expect("grad-scaler-disabled", evidence={"enabled": (enabled, 0)})],
        forbid={"grad-scaler-missing"},
        measured={"enabled": enabled},
    )


def run_clip_before_unscale(out: Path) -> tuple[Session, Truth]:
    """clip_grad_norm_ on the still-scaled gradients (no unscale_ before it)."""
    with seeded(0):
        setup, data, opt = _setup()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        seen: list[tuple[int, float, float]] = []
        with diagnose(out) as d:
            for step, (x, y) in enumerate(data):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    out_ = setup.model(x)
                scale = scaler.get_scale()
                scaler.scale(models.loss_of(out_.float(), y)).backward()
                norm = torch.nn.utils.clip_grad_norm_(setup.model.parameters(), 1.0)
                seen.append((step, scale, float(norm)))
                scaler.step(opt)
                scaler.update()
    first = seen[0]
    return session_of(d), Truth(
        expect=[
            Expect(
                "clip-before-unscale",
                step=first[0],
                evidence={
                    "clips_on_scaled_grads": (len(seen), 0),
                    "scale": (first[1], 0),
                    "total_norm_seen": (first[2], first[2] * 1e-4),
                },
            )
        ],
        measured={"clips": seen},
    )


def run_bypassed(out: Path) -> tuple[Session, Truth]:
    """scaler.scale(loss).backward() then optimizer.step() directly (scaled, unchecked)."""
    with seeded(0):
        setup, data, opt = _setup()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        direct = 0
        with diagnose(out) as d:
            for x, y in data:
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.float16):
                    out_ = setup.model(x)
                scaler.scale(models.loss_of(out_.float(), y)).backward()
                opt.step()  # the misuse
                direct += 1
                d.step()
    return session_of(d), Truth(
        expect=[Expect("scaler-step-bypassed", evidence={"bypassed": (direct, 0)})],
        measured={"direct_optimizer_steps": direct},
    )


def run_fp16_params(out: Path) -> tuple[Session, Truth]:
    """model.half(): the optimizer updates FP16 weights (no autocast, FP16 inputs)."""
    with seeded(0):
        setup, data, _ = _setup()
        model = setup.model.half()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with diagnose(out) as d:
            for x, y in data:
                opt.zero_grad()
                F.cross_entropy(model(x.half()).float(), y).backward()
                opt.step()
    params = [p for p in model.parameters() if p.dtype == torch.float16]
    count, numel = len(params), sum(p.numel() for p in params)
    return session_of(d), Truth(
        expect=[
            Expect(
                "low-precision-params",
                evidence={
                    "low_precision_params": (count, 0),
                    "low_precision_numel": (numel, 0),
                    "dtypes": ({"float16": count}, 0),
                },
            )
        ],
        measured={"fp16_params": count, "fp16_numel": numel},
    )


def run_autocast_only_loss(out: Path) -> tuple[Session, Truth]:
    """Autocast entered only around the loss: every matmul of the model runs in FP32."""
    with seeded(0):
        setup, data, opt = _setup()
        dtypes: set[torch.dtype] = set()

        def record(m: torch.nn.Module, a: Any, o: torch.Tensor) -> None:
            if isinstance(m, torch.nn.Linear):
                dtypes.add(o.dtype)

        handles = [m.register_forward_hook(record) for m in setup.model.modules()]
        with diagnose(out) as d:
            for x, y in data:
                opt.zero_grad()
                out_ = setup.model(x)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = models.loss_of(out_, y)
                loss.backward()
                opt.step()
            for h in handles:
                h.remove()
    assert dtypes == {torch.float32}
    return session_of(d), Truth(
        expect=[
            Expect(
                "low-precision-inactive",
                evidence={"matmul_autocast_share": (0.0, 0), "matmul_fp32_share": (1.0, 0)},
            )
        ],
        forbid={"prefer-bf16", "fp16-grad-underflow"},
        measured={"linear_output_dtypes": sorted(map(str, dtypes))},
    )


SCENARIOS = [
    Scenario("scaler-disabled", "GradScaler('cuda') on a CPU run: disabled.", run_disabled),
    Scenario("clip-before-unscale", "clip_grad_norm_ before unscale_.", run_clip_before_unscale),
    Scenario("scaler-step-bypassed", "optimizer.step() instead of scaler.step().", run_bypassed),
    Scenario("fp16-params", "model.half(): FP16 master weights.", run_fp16_params),
    Scenario(
        "autocast-only-loss",
        "Autocast around the loss only: no matmul in BF16.",
        run_autocast_only_loss,
    ),
]
