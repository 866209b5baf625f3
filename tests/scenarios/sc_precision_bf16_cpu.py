"""A BF16 run on a CPU whose FP16 kernels are slow: the A/B must not overrun its budget on FP16.

The speed probe times FP32 and the run's BF16; the precision A/B's least version runs on every
run, its budget (10% of the block at most, capped here below FP16's measured cost so that the
fault holds on a loaded machine, whose slow block has a large 10%) bounding the rest. FP16,
which the probe never timed, is assumed no slower than the slower of the two -- but on a CPU
without native FP16 kernels a
convolution's FP16 pass is tens of times slower. Before the fix the A/B timed it anyway: its
observed pass, two timed passes and the per-module forwards, several times its budget.

Truth, measured without ampdiag before the run (so that the A/B's FP16 pass is warm, as it
is after any earlier FP16 work in the process), on a copy of the model and a batch of the run:
FP32's and FP16's forward + backward (the run's loss; FP16's scaled as a GradScaler
does), interleaved rounds, medians. The fault is real when FP16's pass is many times FP32's
and FP16's observed run and timing alone at that speed (`TIMING_PASSES` passes: two timed, the
per-module forwards) are over the A/B's whole budget.

What must hold:

- ``fp16-not-timed``: the A/B ran, timed FP32 and BF16 (the run's own precision) at least
  twice, and reports FP16 as not timed (no samples, no time) with the reason (its observed
  pass predicted an overrun of the budget). FP16's numerics (one observed pass) stay.
- ``ab-cost``: the A/B's own wall time (``spent_s``) stays within its budget plus FP16's
  observed pass -- one pass, and one more backward per halving of the loss scale that the
  surrogate loss's FP16 gradients need to be finite from 2^16 (counted here) -- and one FP16
  pass of slack; before the fix it spent 2.7 FP16 passes more (two timed, the per-module
  forwards). A bound on cost, not a speed figure.
- ``no-fp16-speed-claim``: no finding cites a measured FP16 time or speed-up (not in the
  evidence's ``times_ms``, not "FP16 ...x" in a fix or title), and none advises FP16.
"""

from __future__ import annotations

import copy
import re
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
    Scenario,
    Truth,
    diagnose,
    one_thread,
    premise,
    seeded,
    session_of,
)

STEPS = 150  # a block long enough that 10% of it pays for FP32 and BF16, not for FP16
ROUNDS = 3
#: FP16 is slow here when its pass is at least this many times FP32's (measured: 10-15x).
SLOW = 5.0
#: Passes that timing a precision costs after its observed run: two timed rounds and the
#: per-module forwards (about 0.7 of a pass).
TIMING_PASSES = 2.7
#: The slack of the ``ab-cost`` check past FP16's observed pass, in FP16 passes: the observed
#: run's hooks and the machine's noise (timing FP16 costs 2.7 passes more).
SLACK_PASSES = 1.0
_FP16_SPEED = re.compile(r"FP16[^.;\n]{0,40}?\d+\.\d+x")


class Net(nn.Module):
    """Two convolutions: FP16 on a CPU without native FP16 kernels runs them 10-15x slower."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return self.head(h.mean((2, 3)))


def time_passes(model: torch.nn.Module, batch: models.Batch) -> dict[str, float]:
    """FP32's, BF16's and FP16's forward + backward and FP16's backward alone (median ms).

    Interleaved rounds after a warm-up round, the run's loss (FP16's scaled as a GradScaler
    does).
    """
    x, y = batch
    params = list(model.parameters())
    times: dict[str, list[float]] = {"fp32": [], "bf16": [], "fp16": [], "fp16_backward": []}
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for r in range(ROUNDS + 1):
        for name in ("fp32", "bf16", "fp16") if r % 2 else ("fp16", "bf16", "fp32"):
            fp16 = name == "fp16"
            t0 = time.perf_counter()
            with torch.autocast(
                "cpu", dtype=dtypes.get(name, torch.float32), enabled=name in dtypes
            ):
                out = model(x)
            loss = models.loss_of(out.float(), y)
            t1 = time.perf_counter()
            torch.autograd.grad(loss * (2.0**16 if fp16 else 1.0), params)
            t2 = time.perf_counter()
            if r:
                times[name].append((t2 - t0) * 1000)
                if fp16:
                    times["fp16_backward"].append((t2 - t1) * 1000)
    return {n: statistics.median(t) for n, t in times.items()}


def fp16_backwards(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Backwards of the A/B's surrogate loss (the output's sum) in FP16 until finite gradients.

    From a GradScaler's first scale, 2^16, halved after each overflow: what the A/B's observed
    FP16 run repeats to find the scale a GradScaler settles at (documented in `compare`).
    """
    params = list(model.parameters())
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = out.float().sum()
    scale = 2.0**16
    for attempt in range(1, 25):
        grads = torch.autograd.grad(loss * scale, params, retain_graph=True)
        if all(bool(g.isfinite().all()) for g in grads) or scale <= 1.0:
            return attempt
        scale /= 2
    return 24


def _ab(session: Session) -> dict[str, Any]:
    ab = session.section("speed_probe").get("precisions")
    return ab if isinstance(ab, dict) else {}


def _not_timed(session: Session) -> str | None:
    ab = _ab(session)
    if not ab.get("results"):
        why = ab.get("skipped") or ab.get("error") or session.section("speed_probe")
        return f"no A/B ran: {why}"
    rows = {r["precision"]: r for r in ab["results"]}
    for name in ("fp32", "bf16"):
        if rows[name].get("samples", 0) < 2 or rows[name].get("time_ms") is None:
            return f"{name} not timed twice: {rows[name]}"
    fp16 = rows["fp16"]
    if fp16.get("samples") or fp16.get("time_ms") is not None:
        return f"fp16 was timed ({fp16.get('samples')} samples, {fp16.get('time_ms')} ms)"
    why = fp16.get("not_timed")
    if not why or "budget" not in why:
        return f"fp16 not timed without the reason: {why!r}"
    if fp16.get("loss") is None:
        return "fp16's numerics (its observed pass) were lost"
    return None


def _cost(observed_ms: float, pass_ms: float, least_ms: float) -> Any:
    """The A/B held to its budget, or to its least version where that is over the budget.

    The least version (FP32's and BF16's observed run and timing) runs whatever the budget, so
    that identical runs get the same verdict; FP16, past the budget, is only observed.
    """

    def check(session: Session) -> str | None:
        ab = _ab(session)
        held = max(ab.get("budget_s", 0.0), least_ms / 1e3)
        limit = held + (observed_ms + SLACK_PASSES * pass_ms) / 1e3
        if ab.get("spent_s", 0.0) > limit:
            return (
                f"the A/B spent {ab['spent_s']:.2f} s, over its budget {ab['budget_s']:.2f} s "
                f"plus FP16's observed pass ({observed_ms:.0f} ms) and {SLACK_PASSES:g} FP16 "
                f"pass ({limit:.2f} s)"
            )
        return None

    return check


def _no_fp16_claim(session: Session) -> str | None:
    for f in session.all_findings():
        times = f.evidence.get("times_ms")
        if isinstance(times, dict) and "fp16" in times:
            return f"{f.id} cites a measured FP16 time: {times['fp16']}"
        for text in (f.title, f.fix or ""):
            found = _FP16_SPEED.search(text)
            if found:
                return f"{f.id} claims an FP16 speed: {found.group(0)!r}"
        if f.id == "prefer-fp16":
            return f"{f.id} advises FP16: {f.title}"
    return None


def run(out: Path) -> tuple[Session, Truth]:
    with one_thread():
        return _run(out)


def _run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = Net()
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,),
                 generator=g)) for _ in range(STEPS)]  # fmt: skip
        # timed before the block, so that the A/B's FP16 pass is warm whatever ran before in
        # this process (a process's first FP16 convolution costs several passes more)
        reference = copy.deepcopy(model)
        timed = time_passes(reference, data[0])
        backwards = fp16_backwards(reference, data[-1][0])
        # FP16's observed run: one pass, and a backward more for each loss-scale backoff
        observed = timed["fp16"] + (backwards - 1) * timed["fp16_backward"]
        # the A/B's budget (10% of the block) grows with a loaded machine's slow block: capped
        # at half of FP16's measured cost, the fault holds whatever the load
        cap = (observed + TIMING_PASSES * timed["fp16"]) / 2e3
        with diagnose(out, precision_ab_budget_s=cap) as d:
            models.train(model, data, dtype=torch.bfloat16)
    session = session_of(d)
    budget = _ab(session).get("budget_s")
    measured = {"pass_ms": timed, "fp16_over_fp32": timed["fp16"] / timed["fp32"],
                "fp16_backwards": backwards, "fp16_observed_ms": observed,
                "ab_budget_s": budget}  # fmt: skip
    # the fault is real: FP16 is many times slower than FP32 on this CPU, and its observed run
    # and timing alone, at its true speed, are over the A/B's whole budget
    premise(timed["fp16"] >= SLOW * timed["fp32"], "FP16 many times slower than FP32", measured)
    premise(
        budget is None or (observed + TIMING_PASSES * timed["fp16"]) / 1e3 > budget,
        "FP16's observed run and timing over the A/B's budget",
        measured,
    )
    return session, Truth(
        forbid={"prefer-fp16"},
        measured=measured,
        checks={
            "fp16-not-timed": _not_timed,
            "ab-cost": _cost(
                observed, timed["fp16"], (1 + TIMING_PASSES) * (timed["fp32"] + timed["bf16"])
            ),
            "no-fp16-speed-claim": _no_fp16_claim,
        },
    )


SCENARIO = Scenario(
    "precision-bf16-cpu-slow-fp16",
    "BF16 autocast on a CPU whose FP16 kernels are slow: FP16 not timed past the A/B's budget.",
    run,
)
