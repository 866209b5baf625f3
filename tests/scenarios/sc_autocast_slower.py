"""FP16 autocast on a CPU: a small CNN whose FP16 convolutions are far slower than FP32 ones.

A CPU without native FP16 convolution kernels runs autocast's FP16 convolutions tens of times
slower than FP32 ones (on the project's machine, 0.67 -> 47 ms in a ResNet-18 layer). The run
trains correctly (FP16 autocast with a GradScaler); the fault is only its speed.

Truth, without ampdiag: after the run, a copy of the model is timed by the scenario itself,
forward + backward of the same batch in FP32 and under FP16 autocast, interleaved (ABBA), and
the ratio of the two medians is taken. The scenario runs with one intra-op thread (training,
ampdiag's probe and its own timing alike), so that a busy shared machine's thread barriers do
not swamp millisecond passes. When FP16 is at least ``SLOW`` times slower (a
wide margin over a 1.10x slowdown), ``autocast-slower`` must be a claim, not an
uncertain remark. A CPU that runs FP16 at least as fast as FP32 (ratio at most ``FAST``)
forbids it instead; in between the scenario claims nothing about it (no timing is asserted as
a number).
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import (
    ACTIONABLE,
    Expect,
    Scenario,
    Truth,
    diagnose,
    one_thread,
    seeded,
    session_of,
)

STEPS = 6
PAIRS = 11
SLOW = 3.0
FAST = 1.0


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def timed(model: nn.Module, x: torch.Tensor, pairs: int = PAIRS) -> dict[bool, list[float]]:
    """FP32 (False) and FP16-autocast (True) forward + backward times, interleaved (ABBA)."""
    probe = copy.deepcopy(model)

    def once(amp: bool) -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            out = probe(x)
        out.float().sum().backward()
        probe.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    once(False), once(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(pairs):
        for amp in (False, True) if i % 2 == 0 else (True, False):
            times[amp].append(once(amp))
    return times


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0), one_thread():
        model = ConvNet()
        g = torch.Generator().manual_seed(1)
        data = [
            (torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(STEPS)
        ]
        scaler = torch.amp.GradScaler("cpu")
        with diagnose(out) as d:
            models.train(model, data, dtype=torch.float16, scaler=scaler)
        times = timed(model, data[0][0])
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    measured = {
        "fp32_ms": [round(t * 1000, 2) for t in times[False]],
        "fp16_ms": [round(t * 1000, 2) for t in times[True]],
        "median": ratio,
    }
    if ratio >= SLOW:
        truth = Truth(expect=[Expect("autocast-slower", severities=ACTIONABLE)], measured=measured)
    elif ratio <= FAST:
        truth = Truth(forbid={"autocast-slower"}, measured=measured)
    else:  # too close to the thresholds to claim either way; the loader claim still holds
        truth = Truth(forbid={"dataloader-bound"}, measured=measured)
    return session_of(d), truth


SCENARIO = Scenario(
    "autocast-slower-fp16-cpu",
    "A small CNN trained under FP16 autocast on a CPU without fast FP16 convolutions.",
    run,
)
