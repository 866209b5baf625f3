"""The divergence scenarios' shared runs: a learning rate too high, a 0/0 in one micro-batch,
an FP16 overflow that FP32 holds.

Truth is measured without ampdiag: the same loop (same seed, same batches) is run again in
FP32 and in BF16 (and in the run's own precision), and each records the first step whose
model output or loss is non-finite (`first_nonfinite`); the injected 0/0 and overflow are
checked where they are made (the module's FP32 output, counted by a hook of the scenario's
own). The diagnosed run's losses must equal the unwatched run's bit for bit (observe, never
change).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    PRECISION_ADVICE_IDS,
    Expect,
    Truth,
    diagnose,
    seeded,
    session_of,
)

#: The learning rate at which the scenarios' MLP diverges in every precision (measured:
#: FP32 and BF16 reach NaN at step 7, FP16 + GradScaler at step 8 (an inf logit)).
LR_TOO_HIGH = 20.0
STEPS = 16
#: Precision advice a run that diverges whatever the precision must not get.
NO_PRECISION_ADVICE = frozenset({*PRECISION_ADVICE_IDS, "tune-grad-scaler"})


def cause_is(want: str) -> Callable[[Session], str | None]:
    """A check: the divergence result's cause is ``want``."""

    def check(session: Session) -> str | None:
        div = session.section("derived").get("divergence") or {}
        got = (div.get("cause") or {}).get("cause")
        return None if got == want else f"cause {got!r} != {want!r} ({div.get('cause')})"

    return check


def origin_fix_fits(lr: bool) -> Callable[[Session], str | None]:
    """A check on the console summary as the user reads it: the fix it shows for
    ``nonfinite-origin`` (under ``diverged``, or its own) advises no float32 -- the scenario
    measured that the run goes non-finite in FP32 too -- and, where the scenario's cause is a
    learning rate too high (``lr``), names the learning rate, not an op to guard."""

    def check(session: Session) -> str | None:
        from ampdiag.render.console import summary

        lines = summary(session).splitlines()
        at = next((i for i, x in enumerate(lines) if "nonfinite-origin:" in x), None)
        if at is None:
            return "no fix shown for nonfinite-origin"
        head = lines[at]
        indent = len(head) - len(head.lstrip())
        body = [head]
        for line in lines[at + 1 :]:
            if len(line) - len(line.lstrip()) <= indent:
                break
            body.append(line)
        text = " ".join(body)
        if "float32" in text or "autocast" in text:
            return f"float32 advice for a run FP32 does not hold: {text!r}"
        if lr and ("learning rate" not in text or "Guard the op" in text):
            return f"not the learning rate: {text!r}"
        return None

    return check


def _lr_loop(
    dtype: torch.dtype | None, lr: float, out: Path | None
) -> tuple[list[float], list[int], Session | None]:
    """The MLP trained ``STEPS`` steps at ``lr`` (FP16: with a GradScaler), under diagnose()
    when ``out`` is given: its losses, the steps whose output or loss was non-finite."""
    with seeded(0):
        setup = models.make("mlp")
        data = models.batches(setup, STEPS)
        scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
        bad: list[int] = []

        def watch(step: int, o: torch.Tensor, loss: torch.Tensor, batch: models.Batch) -> None:
            if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(loss))):
                bad.append(step)

        def train() -> list[float]:
            return models.train(
                setup.model, data, dtype=dtype, scaler=scaler, lr=lr, before_backward=watch
            )

        if out is None:
            return train(), bad, None
        with diagnose(out) as d:
            losses = train()
    return losses, bad, session_of(d)


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        (x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


def run_lr(out: Path, dtype: torch.dtype | None, lr: float = LR_TOO_HIGH) -> tuple[Session, Truth]:
    """A learning rate too high: diverged, not precision, no precision advice."""
    first: dict[str, int | None] = {}
    for name, dt in (("fp32", None), ("bf16", torch.bfloat16), ("own", dtype)):
        _, bad, _ = _lr_loop(dt, lr, None)
        first[name] = bad[0] if bad else None
    unwatched, _, _ = _lr_loop(dtype, lr, None)
    losses, bad, session = _lr_loop(dtype, lr, out)
    assert session is not None
    assert first["fp32"] is not None and first["bf16"] is not None, f"not divergent: {first}"
    measured: dict[str, Any] = {
        "first_nonfinite": first,
        "bit_identical": _same(losses, unwatched),
        "losses": [round(v, 4) if math.isfinite(v) else str(v) for v in losses],
    }
    assert measured["bit_identical"], "diagnose() changed the training"
    expect = Expect(
        "diverged",
        step=first["own"],
        evidence={"cause": ("not-precision", 0.0)},
        severities=frozenset({"high"}),
    )
    return session, Truth(
        expect=[expect],
        forbid=set(NO_PRECISION_ADVICE),
        measured=measured,
        checks={
            "divergence-cause": cause_is("not-precision"),
            "origin-fix-fits": origin_fix_fits(lr=True),
        },
    )


class RowNorm(nn.Module):
    """Each row divided by its norm: a row of zeros is 0/0 (NaN), in every precision."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)


def run_zero_over_zero(out: Path, at: int = 5, micro: int = 2) -> tuple[Session, Truth]:
    """FP16 + GradScaler, 2 micro-batches a step; micro-batch 1 of step ``at`` holds a row of
    zeros: RowNorm makes 0/0 there. The scaler skips that step and the run recovers."""
    steps = 10
    with seeded(0):
        setup = models.make("mlp")
        model = nn.Sequential(RowNorm(), setup.model)
        data = models.batches(setup, steps * micro)
        data[at * micro + 1][0][3].zero_()
        x_bad = data[at * micro + 1][0]
        fp32_nan = not bool(torch.isfinite(RowNorm()(x_bad.double())).all())
        bf16_nan = not bool(torch.isfinite(RowNorm()(x_bad.bfloat16())).all())
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler("cpu")
        bad_steps: list[int] = []

        def loop() -> list[float]:
            losses = []
            for step in range(steps):
                opt.zero_grad(set_to_none=True)
                total = 0.0
                for k in range(micro):
                    x, y = data[step * micro + k]
                    with torch.autocast("cpu", dtype=torch.float16):
                        o = model(x)
                    loss = models.loss_of(o.float(), y) / micro
                    if not bool(torch.isfinite(loss)):
                        bad_steps.append(step)
                    scaler.scale(loss).backward()
                    total += float(loss.detach())
                scaler.step(opt)
                scaler.update()
                losses.append(total)
            return losses

        with diagnose(out) as d:
            losses = loop()
    measured = {
        "nonfinite_loss_steps": sorted(set(bad_steps)),
        "fp32_nan_at_rownorm": fp32_nan,
        "bf16_nan_at_rownorm": bf16_nan,
        "last_loss": losses[-1],
    }
    assert fp32_nan and bad_steps == [at] and math.isfinite(losses[-1]), measured
    name = next(n for n, m in model.named_modules() if isinstance(m, RowNorm))
    from tests.scenarios.harness import measured_precision_advice

    return session_of(d), Truth(
        expect=[Expect("nonfinite-origin", module=name, step=at)],
        forbid={"diverged", "stalled", "tune-grad-scaler"},
        measured=measured,
        checks={
            "divergence-cause": cause_is("not-precision"),
            "precision-advice-measured": measured_precision_advice("fp16"),
        },
    )


class Amplify(nn.Module):
    """Multiplies by a constant: FP16 overflows (> 65504) where FP32 holds the value."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def run_fp16_overflow(out: Path) -> tuple[Session, Truth]:
    """An FP16 overflow that FP32 holds: Amplify(40000) before a LayerNorm, FP16 + scaler."""
    with seeded(0):
        setup = models.make("mlp")
        mlp = setup.model
        assert isinstance(mlp, models.MLP)
        amp = Amplify(40000.0)
        mlp.body.insert(1, amp)  # after the first Linear, before its ReLU
        mlp.body.insert(2, nn.LayerNorm(64))
        name = next(n for n, m in mlp.named_modules() if m is amp)
        data = models.batches(setup, 8)
        # Truth: the module's output in FP32 (no autocast) and in FP16 autocast, step 0.
        seen: dict[str, float] = {}

        def hook(m: nn.Module, i: Any, o: torch.Tensor) -> None:
            seen[str(o.dtype)] = float(o.detach().float().abs().max())

        h = amp.register_forward_hook(hook)
        with torch.no_grad():
            mlp(data[0][0])
            with torch.autocast("cpu", dtype=torch.float16):
                mlp(data[0][0])
        h.remove()
        bad: list[int] = []

        def watch(step: int, o: torch.Tensor, loss: torch.Tensor, batch: models.Batch) -> None:
            if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(loss))):
                bad.append(step)

        scaler = torch.amp.GradScaler("cpu")
        with diagnose(out) as d:
            models.train(mlp, data, dtype=torch.float16, scaler=scaler, before_backward=watch)
    measured = {
        "fp32_max_abs": seen.get("torch.float32"),
        "fp16_max_abs": seen.get("torch.float16"),
        "nonfinite_steps": bad,
    }
    assert 65504 < seen["torch.float32"] < 1e30 and math.isinf(seen["torch.float16"]), measured
    assert bad and bad[0] == 0 and bad[-1] == len(data) - 1, measured
    return session_of(d), Truth(
        expect=[
            Expect(
                "diverged",
                module=name,
                step=bad[0],
                evidence={"cause": ("precision", 0.0), "kind": ("forward-overflow", 0.0)},
            )
        ],
        measured=measured,
        checks={"divergence-cause": cause_is("precision")},
    )


class _Boost(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 1e8


class GradBoost(nn.Module):
    """Identity forward; its backward multiplies the gradient by 1e8 (FP16 overflows)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Boost.apply(x)  # type: ignore[no-untyped-call,no-any-return]


def run_stall(out: Path, steps: int = 14) -> tuple[Session, Truth]:
    """FP16 + GradScaler; one module's backward overflows FP16 at every scale the scaler
    reaches in ``steps`` steps (65536 down to 4): every step skipped, the loss finite."""
    with seeded(0):
        setup = models.make("mlp")
        mlp = setup.model
        assert isinstance(mlp, models.MLP)
        boost = GradBoost()
        mlp.body.insert(2, boost)
        name = next(n for n, m in mlp.named_modules() if m is boost)
        data = models.batches(setup, steps)
        # Truth, without ampdiag: step 0's gradients in FP32 are finite (times every scale
        # the scaler reaches, they stay within FP32), in FP16 autocast at scale 4 they are not.
        probe = copy_model(mlp)
        x, y = data[0]
        models.loss_of(probe(x), y).backward()
        fp32_finite = all(bool(torch.isfinite(p.grad).all()) for p in probe.parameters())
        probe.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            o = probe(x)
        (models.loss_of(o.float(), y) * 4.0).backward()
        fp16_finite = all(bool(torch.isfinite(p.grad).all()) for p in probe.parameters())
        scaler = torch.amp.GradScaler("cpu")
        scales: list[float] = []
        finite_losses: list[bool] = []

        def watch(step: int, o: torch.Tensor, loss: torch.Tensor, batch: models.Batch) -> None:
            scales.append(float(scaler.get_scale()))
            finite_losses.append(bool(torch.isfinite(loss)))

        with diagnose(out) as d:
            models.train(mlp, data, dtype=torch.float16, scaler=scaler, before_backward=watch)
    after = [*scales[1:], scaler.get_scale()]
    skipped = sum(1 for a, b in zip(scales, after, strict=True) if b < a)
    measured = {
        "fp32_grads_finite": fp32_finite,
        "fp16_grads_finite_at_scale_4": fp16_finite,
        "skipped": skipped,
        "scale_final": scaler.get_scale(),
        "losses_finite": all(finite_losses),
    }
    assert fp32_finite and not fp16_finite and skipped == steps and all(finite_losses), measured
    return session_of(d), Truth(
        expect=[
            Expect(
                "stalled",
                module=name,
                step=0,
                evidence={"cause": ("precision", 0.0), "skipped_steps": (steps, 0)},
            )
        ],
        forbid={"diverged"},
        measured=measured,
        checks={"divergence-cause": cause_is("precision")},
    )


def copy_model(model: nn.Module) -> nn.Module:
    """A deep copy for the scenario's own truth runs (the run's model stays untouched)."""
    import copy

    return copy.deepcopy(model)
