"""The issue's case: an FP16 convolutional net trained on a CPU, where FP16 is slow and BF16 not.

A correct FP16 run (autocast + GradScaler) of a small CNN. On a CPU without native FP16
kernels FP16 autocast is many times slower than FP32, while BF16 runs at FP32's speed or
better; before the precision advice read the A/B, such a run was told both "train in FP32
here" (``autocast-slower``) and "switch to BF16" (``prefer-bf16``).

Truth, measured without ampdiag after the run, on a copy of the trained model and a batch of
the run:

- every precision's forward + backward (the run's loss; FP16's scaled as a GradScaler does)
  in interleaved rounds, order rotated: the median and median absolute deviation of each;
  numerical safety from the loss against FP32's (within 1%) and finite gradients. The
  *acceptable* precisions are the safe ones whose interval overlaps the fastest safe one's.
  The advice must name one of them, or be marked uncertain with one of them among its tied
  precisions (``precision-advice`` check). Timing is never asserted as a number: only
  consistency with this independent measurement, within its spread.
- the cause of FP16's slowdown in the second convolution: its FP16 kernel timed on
  half-precision tensors against its FP32 kernel, and the casts of its input and weights
  timed apart. ``autocast-slower`` must name the cause this measures ("kernels" when the
  kernel's extra time is larger than the casts').
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    Expect,
    Scenario,
    Truth,
    diagnose,
    one_thread,
    premise,
    seeded,
    session_of,
)

STEPS = 150  # a block long enough that 10% of it pays for the A/B (its budget), under load too
ROUNDS = 9
DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                         "fp16": torch.float16}  # fmt: skip
ADVICE = ("prefer-bf16", "prefer-fp32", "prefer-fp16", "tune-grad-scaler")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return self.head(h.mean((2, 3)))


def _median_spread(xs: list[float]) -> tuple[float, float]:
    """The median and the median absolute deviation (the spread every ampdiag time carries)."""
    mid = statistics.median(xs)
    return mid, statistics.median(abs(x - mid) for x in xs)


def time_precisions(model: nn.Module, batch: models.Batch) -> dict[str, dict[str, Any]]:
    """Each precision's forward + backward, interleaved rounds; loss and gradients finiteness."""
    x, y = batch
    params = list(model.parameters())
    times: dict[str, list[float]] = {p: [] for p in DTYPES}
    losses: dict[str, float] = {}
    finite: dict[str, bool] = {}
    names = list(DTYPES)
    for r in range(ROUNDS + 1):  # round 0 warms up
        for name in names[r % 3 :] + names[: r % 3]:
            dtype = DTYPES[name]
            scale = 2.0**16 if name == "fp16" else 1.0
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                out = model(x)
            loss = models.loss_of(out.float(), y)
            grads = torch.autograd.grad(loss * scale, params)
            elapsed = (time.perf_counter() - t0) * 1000
            if r:
                times[name].append(elapsed)
            else:
                losses[name] = float(loss.detach())
                finite[name] = all(bool(g.isfinite().all()) for g in grads)
    out_: dict[str, dict[str, Any]] = {}
    for name in names:
        median, spread = _median_spread(times[name])
        rel = abs(losses[name] - losses["fp32"]) / abs(losses["fp32"])
        out_[name] = {"median_ms": median, "spread_ms": spread, "loss_rel_diff": rel,
                      "safe": finite[name] and rel <= 0.01}  # fmt: skip
    return out_


def acceptable(timed: dict[str, dict[str, Any]]) -> set[str]:
    """The safe precisions whose interval overlaps the fastest safe one's."""
    safe = {p: t for p, t in timed.items() if t["safe"]}
    best = min(safe.values(), key=lambda t: t["median_ms"])
    lo, hi = best["median_ms"] - best["spread_ms"], best["median_ms"] + best["spread_ms"]
    return {
        p
        for p, t in safe.items()
        if t["median_ms"] - t["spread_ms"] <= hi and t["median_ms"] + t["spread_ms"] >= lo
    }


def conv_cause(model: Net, x: torch.Tensor) -> dict[str, float | str]:
    """conv2's FP16 kernel, its FP32 kernel and the casts autocast adds, timed apart (ms)."""
    with torch.no_grad():
        h = F.relu(model.conv1(x))
        w, b = model.conv2.weight, model.conv2.bias
        h16, w16, b16 = h.half(), w.half(), b.half()

        def best(fn: Any) -> float:
            samples = []
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1000)
            return statistics.median(samples)

        fp32 = best(lambda: F.conv2d(h, w, b, padding=1))
        fp16 = best(lambda: F.conv2d(h16, w16, b16, padding=1))
        casts = best(lambda: (h.half(), w.half(), b.half()))
    extra = fp16 - fp32
    return {"conv2_fp32_ms": fp32, "conv2_fp16_ms": fp16, "casts_ms": casts,
            "cause": "kernels" if extra >= casts else "casts"}  # fmt: skip


def _advice_check(ok: set[str]) -> Any:
    def check(session: Session) -> str | None:
        recs = [f for f in session.findings if f.id in ADVICE]
        if len(recs) != 1:
            return f"{len(recs)} precision advices ({[f.id for f in recs]}), want one"
        rec = recs[0]
        if rec.evidence.get("measured") is not True:
            return f"advice not from the A/B: {rec.evidence.get('not_measured')}"
        named = rec.evidence.get("precision")
        if named in ok:
            return None
        tied = set(rec.evidence.get("tied") or [])
        if rec.evidence.get("uncertain") and tied & ok:
            return None
        return f"advised {named} (tied {sorted(tied)}), measured fastest safe {sorted(ok)}"

    return check


def run(out: Path) -> tuple[Session, Truth]:
    with one_thread():  # for the A/B and the truth alike
        return _run(out)


def _run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = Net()
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,),
                 generator=g)) for _ in range(STEPS)]  # fmt: skip
        scaler = torch.amp.GradScaler("cpu")
        with diagnose(out) as d:
            models.train(model, data, dtype=torch.float16, scaler=scaler)
        reference = copy.deepcopy(model)
        timed = time_precisions(reference, data[-1])
        cause = conv_cause(reference, data[-1][0])
    ok = acceptable(timed)
    measured = {"timed": timed, "acceptable": sorted(ok), "conv2": cause}
    # the fault is real: FP16 is not among the fastest safe precisions on this CPU
    premise("fp16" not in ok, "FP16 not among the fastest safe precisions on this CPU", measured)
    return session_of(d), Truth(
        expect=[Expect("autocast-slower", evidence={"cause": (cause["cause"], 0)})],
        forbid=set(),
        measured=measured,
        checks={"precision-advice": _advice_check(ok)},
    )


SCENARIO = Scenario(
    "precision-fp16-cpu",
    "FP16 autocast + GradScaler on a CPU whose FP16 kernels are slow: one advice, measured.",
    run,
)
