"""A BF16 run on a CPU whose FP16 kernels are slow: the A/B must not spend its exit on FP16.

The precision A/B's least version (FP32 and the run's BF16, the speed probe's figures) runs on
every run, its budget (5% of the block at most, capped here below FP16's measured cost so that
the fault holds on a loaded machine, whose slow block has a large 5%) bounding the rest. On a
CPU without native FP16 kernels a convolution's FP16 pass is tens of times slower than FP32's.
Before the first fix the A/B timed it anyway: its observed pass, two timed passes and the
per-module forwards, several times its budget; before the second it still ran FP16's observed
pass and loss-scale search (emulated backwards: 350 ms of timm's 1.9 s exit), although an
emulated FP16 is never the faster choice and the run is not in FP16.

Truth, measured without ampdiag before the run (so that the A/B's FP16 pass is warm, as it
is after any earlier FP16 work in the process), on a copy of the model and a batch of the run:
FP32's and FP16's forward + backward (the run's loss; FP16's scaled as a GradScaler
does), interleaved rounds, medians of wall and of thread CPU time. The fault is real when
FP16's pass is many times FP32's and FP16's observed run and timing alone at that speed
(`TIMING_PASSES` passes: three timed, the per-module forwards) are over the A/B's whole budget.

What must hold:

- ``fp16-not-run``: the A/B ran, timed FP32 and BF16 (the run's own precision) at least
  twice, or once where that one pass was already 2x the other's least (emulated BF16 there),
  and reports FP16 as not run -- no samples, no time, no numerics (no observed pass) -- with
  the reason: this CPU emulates FP16, and the run is in BF16.
- ``ab-cost``: the A/B's CPU time (its thread's, measured here around the A/B's call) stays
  within its budget (or its least version's cost, where that is over it) and one FP16 pass of
  slack; before the first fix it spent FP16's observed run and 3.7 FP16 passes more (three
  timed, the per-module forwards). A bound on cost, not a speed figure. Both sides are thread
  CPU time (one thread), the wall-time budget counted at the share of a core the A/B had: a
  busy core that stretches the A/B's wall time stretches neither (its wall time was compared
  with passes timed at another moment, and a busy machine pushed it 1% over).
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
from unittest import mock

import torch
from torch import nn
from torch.nn import functional as F

from ampdiag.session import Session
from ampdiag.sources.live.collectors import speed_probe
from ampdiag.sources.live.environment import cpu_flags, fp16_native
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
#: Passes that timing a precision costs after its observed run: three timed rounds and the
#: per-module forwards (about 0.7 of a pass).
TIMING_PASSES = 3.7
#: Passes an observed run costs: the pass, and its hooks copying every leaf module's output
#: and counting the saved tensors (about half a pass more).
OBSERVED_PASSES = 1.5
#: The slack of the ``ab-cost`` check, in FP16 passes: the model's copy and the machine's
#: noise (timing FP16 costs 3.7 passes more, observing it 1.5 and its backoff's backwards).
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


def time_passes(model: torch.nn.Module, batch: models.Batch) -> dict[str, dict[str, float]]:
    """FP32's, BF16's and FP16's forward + backward and FP16's backward alone (median ms).

    Interleaved rounds after a warm-up round, the run's loss (FP16's scaled as a GradScaler
    does); by wall time (``"wall"``) and by this thread's CPU time (``"cpu"``).
    """
    x, y = batch
    params = list(model.parameters())
    names = ("fp32", "bf16", "fp16", "fp16_backward")
    times: dict[str, dict[str, list[float]]] = {c: {n: [] for n in names} for c in ("wall", "cpu")}
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for r in range(ROUNDS + 1):
        for name in ("fp32", "bf16", "fp16") if r % 2 else ("fp16", "bf16", "fp32"):
            fp16 = name == "fp16"
            t0, c0 = time.perf_counter(), time.thread_time()
            with torch.autocast(
                "cpu", dtype=dtypes.get(name, torch.float32), enabled=name in dtypes
            ):
                out = model(x)
            loss = models.loss_of(out.float(), y)
            t1, c1 = time.perf_counter(), time.thread_time()
            torch.autograd.grad(loss * (2.0**16 if fp16 else 1.0), params)
            t2, c2 = time.perf_counter(), time.thread_time()
            if r:
                for clock, (a, b, c) in (("wall", (t0, t1, t2)), ("cpu", (c0, c1, c2))):
                    times[clock][name].append((c - a) * 1000)
                    if fp16:
                        times[clock]["fp16_backward"].append((c - b) * 1000)
    return {c: {n: statistics.median(t) for n, t in ts.items()} for c, ts in times.items()}


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


def _not_run(session: Session) -> str | None:
    ab = _ab(session)
    if not ab.get("results"):
        why = ab.get("skipped") or ab.get("error") or session.section("speed_probe")
        return f"no A/B ran: {why}"
    rows = {r["precision"]: r for r in ab["results"]}
    least = {n: min(rows[n].get("times_ms") or [float("inf")]) for n in ("fp32", "bf16")}
    for name, other in (("fp32", "bf16"), ("bf16", "fp32")):
        times = rows[name].get("times_ms") or []
        once = len(times) == 1 and times[0] >= 2 * least[other]  # out of the race at once
        if (len(times) < 2 and not once) or rows[name].get("time_ms") is None:
            return f"{name} not timed twice (nor once at 2x the other): {rows[name]}"
    fp16 = rows["fp16"]
    if fp16.get("samples") or fp16.get("time_ms") is not None:
        return f"fp16 was timed ({fp16.get('samples')} samples, {fp16.get('time_ms')} ms)"
    if fp16.get("loss") is not None or fp16.get("saved_bytes") is not None:
        return f"fp16 was run (its observed pass): loss {fp16.get('loss')}"
    why = fp16.get("not_run") or ""
    if "emulates FP16" not in why or "BF16" not in why:
        return f"fp16 not run without the reason in words: {why!r}"
    return None


def _cost(cpu_ms: dict[str, float], ab_s: list[tuple[float, float]]) -> Any:
    """The A/B held to its budget, or to its least version where that is over the budget.

    The least version (FP32's and BF16's observed run and timing) runs whatever the budget, so
    that identical runs get the same verdict; FP16, emulated here, is not run. In
    thread CPU time: the passes' (``cpu_ms``) and the A/B's (``ab_s``: its CPU and wall
    seconds, measured here around its call); its wall-time budget counts at the share of a core
    the A/B's thread had meanwhile (its CPU over its wall time), so that a busy machine slows
    both sides alike.
    """

    def check(session: Session) -> str | None:
        ab = _ab(session)
        if len(ab_s) != 1:
            return f"the A/B ran {len(ab_s)} times, not once"
        cpu, wall = ab_s[0]
        budget = ab.get("budget_s", 0.0) * min(1.0, cpu / max(wall, 1e-9))
        least = (OBSERVED_PASSES + TIMING_PASSES) * (cpu_ms["fp32"] + cpu_ms["bf16"])
        limit = max(budget, least / 1e3) + SLACK_PASSES * cpu_ms["fp16"] / 1e3
        if cpu > limit:
            return (
                f"the A/B spent {cpu:.2f} s of CPU time ({wall:.2f} s wall), over its budget "
                f"({budget:.2f} s of CPU at its share of a core; {ab.get('budget_s', 0.0):.2f} s "
                f"wall) or its least version ({least / 1e3:.2f} s), plus {SLACK_PASSES:g} FP16 "
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
        clocks = time_passes(reference, data[0])
        timed = clocks["wall"]
        backwards = fp16_backwards(reference, data[-1][0])
        # FP16's observed run: one pass, and at most a backward more for each loss-scale backoff
        observed = timed["fp16"] + (backwards - 1) * timed["fp16_backward"]
        # the A/B's budget (5% of the block) grows with a loaded machine's slow block: capped
        # at half of FP16's measured cost, the fault holds whatever the load
        cap = (observed + TIMING_PASSES * timed["fp16"]) / 2e3
        ab_s: list[tuple[float, float]] = []  # the A/B's CPU and wall seconds
        real = speed_probe.compare

        def timed_ab(*args: Any, **kwargs: Any) -> Any:
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                ab_s.append((time.thread_time() - c0, time.perf_counter() - t0))

        with (
            mock.patch.object(speed_probe, "compare", timed_ab),
            diagnose(out, precision_ab_budget_s=cap) as d,
        ):
            models.train(model, data, dtype=torch.bfloat16)
    session = session_of(d)
    budget = _ab(session).get("budget_s")
    measured = {"pass_ms": timed, "pass_cpu_ms": clocks["cpu"],
                "fp16_over_fp32": timed["fp16"] / timed["fp32"], "fp16_backwards": backwards,
                "fp16_observed_ms": observed, "ab_budget_s": budget,
                "ab_cpu_wall_s": ab_s}  # fmt: skip
    # the fault is real: FP16 is many times slower than FP32 on this CPU, and its observed run
    # and timing alone, at its true speed, are over the A/B's whole budget
    premise(timed["fp16"] >= SLOW * timed["fp32"], "FP16 many times slower than FP32", measured)
    # a CPU with AVX512_FP16/AMX_FP16 whose convolutions are slow in FP16 all the same: FP16
    # runs there (timed within the budget, or not timed past it, with its numerics)
    premise(not fp16_native(torch.device("cpu")), "no AVX512_FP16/AMX_FP16", cpu_flags())
    premise(
        budget is None or (observed + TIMING_PASSES * timed["fp16"]) / 1e3 > budget,
        "FP16's observed run and timing over the A/B's budget",
        measured,
    )
    return session, Truth(
        forbid={"prefer-fp16"},
        measured=measured,
        checks={
            "fp16-not-run": _not_run,
            "ab-cost": _cost(clocks["cpu"], ab_s),
            "no-fp16-speed-claim": _no_fp16_claim,
        },
    )


SCENARIO = Scenario(
    "precision-bf16-cpu-slow-fp16",
    "BF16 autocast on a CPU whose FP16 kernels are slow: the A/B does not run FP16 at all.",
    run,
)
