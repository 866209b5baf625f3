"""Healthy controls for the causes of issue 34: training done right must draw no alarm.

* ``healthy-fp16-unet-ema``: a small UNet (conv encoder, decoder, a skip connection) in FP16
  autocast with a GradScaler used right (scale, unscale, clip, step, update), an EMA copy of
  the model updated after every step and evaluated, and zero_grad every step.
* ``healthy-bf16-accum-clip-cosine``: the scenarios' GPT in BF16 autocast, two micro-batches
  per step (loss divided by 2, gradients cleared once per step), gradient clipping and a
  cosine learning-rate schedule.

The truth measured: every loss finite, and the weights moved every step (each step changed
them: no skipped, no lost update beyond the scaler's first search). Forbidden: every
numerics and misuse finding at medium or above (a low note on the scaler's first skip is the
scaler finding its scale), and the new causes at any severity.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import HEALTHY_FORBID, Scenario, Truth, diagnose, seeded, session_of

STEPS = 10
NEW_CAUSES = {"grads-not-zeroed", "grad-scaler-config", "diverged", "stalled", "nonfinite-origin"}


def no_alarm(session: Session) -> str | None:
    """No numerics or misuse finding at medium or above."""
    loud = [
        f"{f.id} ({f.severity}): {f.title[:120]}"
        for f in session.all_findings()
        if f.id in HEALTHY_FORBID and f.severity in ("medium", "high")
    ]
    return "; ".join(loud) or None


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.mid = nn.Sequential(
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(4, 32), nn.SiLU()
        )
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.out = nn.Conv2d(32, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(x)
        return self.out(torch.cat([h, self.up(self.mid(h))], dim=1))


def _moved(before: list[torch.Tensor], model: nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def run_unet(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = UNet()
        ema = copy.deepcopy(model).requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        g = torch.Generator().manual_seed(1)
        data = [torch.randn(4, 3, 16, 16, generator=g) for _ in range(STEPS)]
        losses: list[float] = []
        moved: list[bool] = []
        with diagnose(out) as d:
            for x in data:
                opt.zero_grad(set_to_none=True)
                noise = torch.randn(x.shape, generator=g)
                with torch.autocast("cpu", dtype=torch.float16):
                    pred = model(x + noise)
                loss = nn.functional.mse_loss(pred.float(), noise)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                before = [p.detach().clone() for p in model.parameters()]
                scaler.step(opt)
                scaler.update()
                moved.append(_moved(before, model))
                with torch.no_grad():
                    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                        e.lerp_(p, 0.1)
                    ema(x)
                losses.append(float(loss.detach()))
    return _healthy(session_of(d), losses, moved)


def run_bf16(out: Path) -> tuple[Session, Truth]:
    micro = 2
    with seeded(0):
        setup = models.make("gpt", batch_size=8)
        model = setup.model
        data = models.batches(setup, STEPS * micro)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
        losses: list[float] = []
        moved: list[bool] = []
        with diagnose(out) as d:
            for step in range(STEPS):
                opt.zero_grad(set_to_none=True)
                total = 0.0
                for k in range(micro):
                    x, y = data[step * micro + k]
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        o = model(x)
                    loss = models.loss_of(o.float(), y) / micro
                    loss.backward()
                    total += float(loss.detach())
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                before = [p.detach().clone() for p in model.parameters()]
                opt.step()
                sched.step()
                moved.append(_moved(before, model))
                losses.append(total)
    return _healthy(session_of(d), losses, moved, scaled=False)


def _healthy(
    session: Session, losses: list[float], moved: list[bool], scaled: bool = True
) -> tuple[Session, Truth]:
    measured = {
        "all_finite": all(map(math.isfinite, losses)),
        "steps_that_moved_the_weights": sum(moved),
        "steps": len(moved),
    }
    # a GradScaler may skip its very first steps while it finds its scale; nothing after
    assert measured["all_finite"] and all(moved[2 if scaled else 0 :]), measured
    checks: dict[str, Callable[[Session], str | None]] = {"no-alarm": no_alarm}
    return session, Truth(forbid=set(NEW_CAUSES), measured=measured, checks=checks)


SCENARIOS = [
    Scenario(
        "healthy-fp16-unet-ema",
        "FP16 UNet + EMA copy + GradScaler used right: no alarm at medium or above.",
        run_unet,
    ),
    Scenario(
        "healthy-bf16-accum-clip-cosine",
        "BF16 GPT, 2 micro-batches, clipping, cosine schedule: no alarm at medium or above.",
        run_bf16,
    ),
]
