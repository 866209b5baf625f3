"""The memory scenarios' shared run: tutorial 2's MLP under bf16 autocast, and its allocator truth.

The truth is the CPU allocator's own account, measured without ampdiag: the same loop runs
inside a plain ``torch.profiler.profile(profile_memory=True)`` that starts *before* anything
is built (model, data, optimizer), so every allocation and every free of the run is reported
with its size; the most bytes live at once inside a step's ``record_function`` mark is that
step's peak (`allocator_peaks`). ampdiag's peak (the timeline of its profiled step) must
match it: the same tensors, counted by another instrument.

The loop keeps one thing real code does and that broke the peak: at the start of each step it
reads a copy it took of the last step's largest gradient (a "gradient change" log), then drops
it. That copy was made before ampdiag's profiler began reporting allocations, so the profile
never sees its free; torch's memory profiler counts such a tensor live to the end of the
window, and the peak grew by its 4 MiB (and by the last step's gradients, which ampdiag's
own statistics read) in some runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

Mark = Callable[[int], AbstractContextManager[Any]]

DIM, HIDDEN, CLASSES, DATASET = 256, 1024, 10, 4096


def mlp(hidden: int = HIDDEN) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )  # fmt: skip


@dataclass
class Run:
    """One training run's objects (built inside the truth's profiler, or before diagnose())."""

    model: nn.Sequential
    opt: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    log: list[float] = field(default_factory=list)


def build(hidden: int = HIDDEN, momentum: float = 0.9, adam: bool = False) -> Run:
    """The model, an optimizer with state, and a dataset of 4096 samples (seeded)."""
    torch.manual_seed(0)
    model = mlp(hidden)
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=1e-3)
        if adam
        else torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(DATASET, DIM, generator=g)
    y = torch.randint(0, CLASSES, (DATASET,), generator=g)
    return Run(model, opt, x, y)


def train(run: Run, batch: int, steps: int, mark: Mark | None = None, micro: int = 0) -> None:
    """``steps`` optimizer steps of ``batch`` samples (in micro-batches of ``micro``, averaged,
    when given), bf16 autocast; each step first reads and drops the last step's gradient copy."""
    mark = mark or (lambda _n: nullcontext())
    snap: torch.Tensor | None = None
    for n in range(steps):
        with mark(n):
            if snap is not None:
                run.log.append(float(snap.norm()))
                snap = None
            x, y = run.x[:batch], run.y[:batch]
            run.opt.zero_grad(set_to_none=True)
            parts = list(zip(x.split(micro or batch), y.split(micro or batch), strict=True))
            for xs, ys in parts:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(run.model(xs), ys) * (len(xs) / len(x))
                loss.backward()
            snap = run.model[2].weight.grad.detach().clone()  # type: ignore[union-attr]
            run.opt.step()


def allocator_peaks(job: Callable[[Mark], None]) -> dict[int, int]:
    """Per step (``mark(n)``): the most bytes the CPU allocator had live at once (module doc).

    ``job(mark)`` builds everything it uses itself, inside the profile.
    """
    prefix = "truth-step-"
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        torch.zeros(1)  # the profiler's first allocations can go unreported: spend them here
        job(lambda n: torch.profiler.record_function(f"{prefix}{n}"))
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    memory = sorted(
        (e.start_ns(), int(e.nbytes()))
        for e in events
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    marks = {
        int(e.name()[len(prefix) :]): (e.start_ns(), e.end_ns())
        for e in events
        if e.name().startswith(prefix)
    }
    peaks = dict.fromkeys(marks, 0)
    live = 0
    for t, nbytes in memory:
        live += nbytes
        for n, (start, end) in marks.items():
            if start <= t <= end:
                peaks[n] = max(peaks[n], live)
    return peaks


def state_bytes(run: Run) -> dict[str, int]:
    """Parameters, gradients (every parameter's, as after a step) and optimizer state, by
    arithmetic on the shapes: 4 bytes per FP32 element; SGD momentum holds one copy, Adam two
    (and a step counter per parameter)."""
    params = sum(4 * p.numel() for p in run.model.parameters())
    copies = 2 if isinstance(run.opt, torch.optim.Adam) else 1
    counters = 4 * len(list(run.model.parameters())) if copies == 2 else 0
    return {
        "parameters": params,
        "gradients": params,
        "optimizer_state": copies * params + counters,
    }


def linear_root(points: list[tuple[int, int]], level: float) -> float:
    """The x at which the line through two (x, y) points reaches ``level``."""
    (x1, y1), (x2, y2) = points
    slope = (y2 - y1) / (x2 - x1)
    return math.inf if slope <= 0 else x1 + (level - y1) / slope
