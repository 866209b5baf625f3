"""Two FP16 faults whose fix is one op's, not a module's float32: a -1e9 mask and a custom Function.

* **mask**: causal self-attention over left-padded sequences adds ``(1 - allowed) * -1e9`` to
  its scores in the scores' dtype. In FP16 (max 65504) the constant is -inf, and a padded query
  that sees only padded keys gets a row of -inf: softmax makes NaN. Padding starts at step
  ``BAD_STEP``. The fix is the mask value of the scores' own dtype,
  ``masked_fill(~allowed, torch.finfo(scores.dtype).min)``.
* **custom Function**: a hand-written ``torch.autograd.Function`` (exp, normalized without
  subtracting the max) fed FP16 by autocast: exp overflows past x = 11.1 in FP16 (88.7 in
  FP32). The inputs grow step by step. The fix is ``torch.amp.custom_fwd(cast_inputs=
  torch.float32)``.

Truth, measured without ampdiag: the model checks its own ops on every step and records the
first step whose attention weights hold a NaN (with the -1e9 bias -inf there), or whose exp
holds an inf -- where the non-finite value first appears; the
same loop with the fix applied (``finfo.min`` mask; ``custom_fwd``) runs and stays finite,
and those runs are the healthy controls (no numerics finding at all).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

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

DIM, TOKENS, STEPS, BAD_STEP, PAD = 32, 8, 8, 4, 3


class MaskedAttention(nn.Module):
    """Causal attention over left-padded tokens (padding: all-zero rows of ``x``)."""

    def __init__(self, finfo_min: bool) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.finfo_min = finfo_min
        self.now = -1
        self.nan_steps: list[int] = []  # the scenario's own check: NaN attention weights
        self.bias_inf: list[bool] = []  # ... and whether the -1e9 bias held -inf there

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(DIM)
        keys = x.abs().sum(-1) != 0  # (B, T): real tokens
        causal = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()
        allowed = causal & keys[:, None, :]
        if self.finfo_min:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        else:
            bias = (1.0 - allowed.to(scores.dtype)) * -1e9  # the bug in FP16: -inf
            scores = scores + bias
            weights = scores.softmax(-1)
            if not bool(torch.isfinite(weights).all()) and self.now not in self.nan_steps:
                self.nan_steps.append(self.now)
                self.bias_inf.append(bool(torch.isinf(bias).any()))
            return self.out(weights @ v)
        return self.out(scores.softmax(-1) @ v)


class ExpNormalize(torch.autograd.Function):
    """exp(x) / sum(exp(x)) without subtracting the max: overflows FP16 past x = 11.1."""

    inf_steps: ClassVar[list[int]] = []
    now = -1

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        e = x.exp()
        if bool(torch.isinf(e).any()) and ExpNormalize.now not in ExpNormalize.inf_steps:
            ExpNormalize.inf_steps.append(ExpNormalize.now)
        y = e / e.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True))


class ExpNormalizeFP32(torch.autograd.Function):
    """The same Function with its forward run in FP32 under autocast (the fix)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.exp() / x.exp().sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(-1, keepdim=True))


class Normalize(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fn = ExpNormalizeFP32 if fixed else ExpNormalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fn.apply(x)
        return out


class AttnNet(nn.Module):
    def __init__(self, finfo_min: bool) -> None:
        super().__init__()
        self.attn = MaskedAttention(finfo_min)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x).mean(1))


class FnNet(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)
        self.norm = Normalize(fixed)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.proj(x)))


def _mask_data() -> list[models.Batch]:
    g = torch.Generator().manual_seed(1)
    data = []
    for i in range(STEPS):
        x = torch.randn(8, TOKENS, DIM, generator=g)
        if i >= BAD_STEP:
            x[:4, :PAD] = 0.0  # left padding: its queries see only padded keys
        data.append((x, torch.randint(0, 10, (8,), generator=g)))
    return data


def _fn_data() -> list[models.Batch]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, DIM, generator=g) * 1.8 * 1.5**i, torch.randint(0, 10, (16,), generator=g))
        for i in range(STEPS)
    ]


def _train(out: Path, model: nn.Module, data: list[models.Batch], step_hook: Any) -> Session:
    with diagnose(out) as d:
        models.train(
            model,
            data,
            dtype=torch.float16,
            scaler=torch.amp.GradScaler("cpu"),
            lr=0.01,
            step_hook=step_hook,
        )
    return session_of(d)


def _finite(model: nn.Module, data: list[models.Batch], dtype: torch.dtype | None) -> bool:
    """The same loop without ampdiag: every loss finite."""
    losses = models.train(
        model, data, dtype=dtype, scaler=torch.amp.GradScaler("cpu", enabled=dtype is not None)
    )
    return all(math.isfinite(v) for v in losses)


def _fix_check(needle: str) -> Any:
    def check(session: Session) -> str | None:
        found = [f for f in session.all_findings() if f.id == "diverged"]
        if not found or needle not in found[0].fix:
            return f"the diverged fix does not name {needle!r}: {found[0].fix if found else None}"
        return None

    return check


def run_mask(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = AttnNet(finfo_min=False)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        attn = model.attn

        def hook(step: int) -> None:
            attn.now = step

        session = _train(out, model, _mask_data(), hook)
        fixed, fp32 = AttnNet(finfo_min=True), AttnNet(finfo_min=False)
        fixed.load_state_dict(start)
        fp32.load_state_dict(start)
        measured = {
            "first_nan_step": attn.nan_steps[0] if attn.nan_steps else None,
            "bias_inf_there": attn.bias_inf[:1] == [True],
            "finfo_min_finite": _finite(fixed, _mask_data(), torch.float16),
            "fp32_finite": _finite(fp32, _mask_data(), None),
        }
    assert measured["first_nan_step"] == BAD_STEP and measured["bias_inf_there"], measured
    assert measured["finfo_min_finite"] and measured["fp32_finite"], measured
    return session, Truth(
        expect=[
            Expect(
                "diverged",
                module="attn",
                step=BAD_STEP,
                evidence={"cause": ("precision", 0), "kind": ("mask-constant", 0)},
            )
        ],
        checks={"diverged": _fix_check("torch.finfo(scores.dtype).min")},
        measured=measured,
    )


def run_custom_function(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = FnNet(fixed=False)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        ExpNormalize.inf_steps = []

        def hook(step: int) -> None:
            ExpNormalize.now = step

        session = _train(out, model, _fn_data(), hook)
        first = ExpNormalize.inf_steps[0] if ExpNormalize.inf_steps else None
        fixed = FnNet(fixed=True)
        fixed.load_state_dict(start)
        measured = {
            "first_inf_step": first,
            "custom_fwd_finite": _finite(fixed, _fn_data(), torch.float16),
        }
    assert first is not None and first > 0 and measured["custom_fwd_finite"], measured
    return session, Truth(
        expect=[
            Expect(
                "diverged",
                module="norm",
                step=first,
                evidence={"cause": ("precision", 0), "kind": ("custom-function", 0)},
            )
        ],
        checks={"diverged": _fix_check("custom_fwd(device_type='cpu', cast_inputs=torch.float32)")},
        measured=measured,
    )


def run_mask_control(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        session = _train(out, AttnNet(finfo_min=True), _mask_data(), lambda step: None)
    return session, Truth(forbid=set(HEALTHY_FORBID))


def run_custom_function_control(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        session = _train(out, FnNet(fixed=True), _fn_data(), lambda step: None)
    # The saturated normalization's gradients are small: their underflow is not this control's.
    return session, Truth(forbid=set(HEALTHY_FORBID - {"fp16-grad-underflow"}))


SCENARIOS = [
    Scenario(
        "op-cause-mask-minus-1e9",
        "An attention mask of -1e9 in FP16 is -inf: a fully padded row makes NaN.",
        run_mask,
    ),
    Scenario(
        "op-cause-custom-function-fp16",
        "A custom autograd Function fed FP16 by autocast overflows its exp.",
        run_custom_function,
    ),
    Scenario(
        "op-cause-mask-finfo-min-control",
        "The same attention masked with torch.finfo(dtype).min: finite, no finding.",
        run_mask_control,
    ),
    Scenario(
        "op-cause-custom-fwd-control",
        "The same Function under custom_fwd(cast_inputs=torch.float32): finite, no finding.",
        run_custom_function_control,
    ),
]
