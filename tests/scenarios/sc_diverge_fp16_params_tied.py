"""A tied LM head stored in FP16 (``model.half()``, no autocast) overflows FP16 as it learns.

The model's softmax is its own (``exp`` then a sum): as the tied embedding learns, the logits
grow while the loss falls, and ``exp`` of a logit over 11.09 is beyond FP16's 65504. The same
loop in FP32 stays finite (measured, every step); the unwatched FP16 loop's first non-finite
step is measured, and at that step the FP16 weights copied to FP32 give a finite forward whose
``exp`` output leaves FP16's range (measured by the scenario's own copy). The sentinel's FP32
replay must run on an FP32 copy (the model's own weights are FP16: replaying them as they are
fails with "mat1 and mat2 must have the same dtype") and find the cause: precision.

A replay that failed is no evidence: the finding must never say "not the precision" here.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios.divergence import cause_is
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

STEPS = 16
LR = 0.05
VOCAB, WIDTH = 64, 32


class Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)


class TiedLM(nn.Module):
    """Embedding, a small body, an LM head tied to the embedding, its own softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.exp = Exp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.exp(self.head(self.body(self.emb(x))))
        return e / e.sum(-1, keepdim=True)


def _loop(
    dtype: torch.dtype, out: Path | None = None, probe: bool = False
) -> tuple[list[float], dict[str, float], Session | None]:
    """The loop; its losses; with ``probe``, at the first non-finite step (before its forward)
    the weights copied to FP32: that forward's finiteness and its ``exp`` output's max |x|."""
    with seeded(0):
        model = TiedLM().to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, VOCAB, (8, 16), generator=g)
        seen: dict[str, float] = {}

        def loop() -> list[float]:
            losses: list[float] = []
            peak = p32 = torch.zeros(())
            for step in range(STEPS):
                if probe and "step" not in seen:
                    ref = copy.deepcopy(model).float()
                    with torch.no_grad():
                        peak = ref.exp(ref.head(ref.body(ref.emb(x)))).abs().max()
                        p32 = ref(x)
                p = model(x)
                loss = -torch.log(p.float().gather(-1, x[..., None]) + 1e-6).mean()
                losses.append(float(loss.detach()))
                if probe and "step" not in seen and not math.isfinite(losses[-1]):
                    seen.update(
                        step=step,
                        fp32_copy_finite=float(bool(torch.isfinite(p32).all())),
                        fp32_copy_exp_max=float(peak),
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            return losses

        if out is None:
            return loop(), seen, None
        with diagnose(out) as d:
            losses = loop()
    return losses, seen, session_of(d)


def no_unfounded_not_precision(session: Session) -> str | None:
    """No finding says the precision is not the cause (the scenario measured that it is)."""
    for f in session.all_findings():
        text = f"{f.title} {f.fix}"
        if "not the precision" in text or "FP32 too" in text or "not caused by" in text:
            return f"{f.id} says the precision is not the cause: {text[:200]!r}"
    return None


def run(out: Path) -> tuple[Session, Truth]:
    fp32, _, _ = _loop(torch.float32)
    fp16, probe, _ = _loop(torch.float16, probe=True)
    watched, _, session = _loop(torch.float16, out)
    assert session is not None
    first = next(i for i, v in enumerate(fp16) if not math.isfinite(v))
    measured = {
        "fp32_all_finite": all(math.isfinite(v) for v in fp32),
        "fp32_loss_fell": fp32[-1] < fp32[0],
        "fp16_first_nonfinite": first,
        **probe,
        "bit_identical": [str(v) for v in watched] == [str(v) for v in fp16],
    }
    assert measured["fp32_all_finite"] and measured["fp32_loss_fell"], measured
    assert probe["fp32_copy_finite"] == 1.0 and probe["fp32_copy_exp_max"] > 65504, measured
    assert measured["bit_identical"], "diagnose() changed the training"
    return session, Truth(
        expect=[
            Expect(
                "diverged",
                module="exp",
                step=first,
                evidence={"cause": ("precision", 0.0)},
                severities=frozenset({"high"}),
            )
        ],
        measured=measured,
        checks={
            "divergence-cause": cause_is("precision"),
            "no-unfounded-not-precision": no_unfounded_not_precision,
        },
    )


SCENARIO = Scenario(
    "diverge-fp16-params-tied-head",
    "A tied LM head stored in FP16 (model.half()) overflows exp at the step FP32 holds.",
    run,
)
