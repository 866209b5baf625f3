"""Attention scores QKᵀ computed without the 1/√d scaling overflow FP16 inside the attention
module's own forward (between its v_proj and its out_proj), FP16 autocast + GradScaler.

The inputs grow step by step (x · 1.5^step) until the scores pass 65504. The inf is made by
the attention module's own code, not by any of its children: q_proj, k_proj and v_proj
return finite values and out_proj receives NaN already. nonfinite-origin must name the
attention module, the step, and the children the value was made between.

Truth, recorded at the injection without ampdiag: the module checks its own scores (and its
children's outputs) on every step and records the first step whose scores are not finite.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

DIM, TOKENS, STEPS = 64, 8, 12


class UnscaledAttention(nn.Module):
    """Single-head self-attention that forgets to divide QKᵀ by √d."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.now = -1
        self.fired: list[int] = []  # steps whose scores were not finite
        self.children_finite: list[bool] = []  # q, k, v finite on those steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        scores = q @ k.transpose(-2, -1)  # the bug: no / math.sqrt(DIM)
        if not bool(torch.isfinite(scores).all()):
            self.fired.append(self.now)
            self.children_finite.append(all(bool(torch.isfinite(t).all()) for t in (q, k, v)))
        return self.out_proj(scores.softmax(-1) @ v)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = UnscaledAttention(DIM)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x).mean(1))


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = Net()
        g = torch.Generator().manual_seed(1)
        data = [
            (
                torch.randn(16, TOKENS, DIM, generator=g) * 1.5**i,
                torch.randint(0, 10, (16,), generator=g),
            )
            for i in range(STEPS)
        ]
        attn = model.attn
        names = {m: n for n, m in model.named_modules()}

        def step_hook(step: int) -> None:
            attn.now = step

        scaler = torch.amp.GradScaler("cpu")
        with diagnose(out) as d:
            models.train(model, data, dtype=torch.float16, scaler=scaler, step_hook=step_hook)
    assert attn.fired and all(attn.children_finite), (attn.fired, attn.children_finite)
    first = attn.fired[0]
    between = [names[attn.v_proj], names[attn.out_proj]]
    measured = {"first_step": first, "module": names[attn], "between": between}
    expect = Expect(
        "nonfinite-origin",
        module=names[attn],
        step=first,
        evidence={
            "phase": ("forward", 0.0),
            "parent_code": (True, 0.0),
            "between": (between, 0.0),
        },
    )
    return session_of(d), Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-attention-scores",
    "QKᵀ without 1/√d overflows FP16 in the attention module's own code (FP16 + GradScaler).",
    run,
)
