"""Long steps, or steps of many ops: the profiler records one step, and says so.

A long step of many small ops is millions of profiler events, each recorded step tens of
seconds of the user's exit. Truth: each step's CPU time in the training thread, measured by the
test around the step itself (the step before the profiler's window decides; the machine's load
does not stretch it), and the profiler steps counted in the trace file the run wrote (its
``ProfilerStep#N`` events, read with ``json``); a step's ATen ops, counted by a dispatch mode of
the test's own on the same forward and backward.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag

LONG_S = 0.25


def busy(seconds: float) -> None:
    """Works ``seconds`` of this thread's CPU time (a step's own work, which load cannot fake)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def run(out: Path, pause_s: float, steps: int = 7, wait_s: float = 0.0) -> tuple[Any, list[float]]:
    """Trains ``steps`` steps, each ``pause_s`` of CPU work and ``wait_s`` of sleep longer.

    Returns the run and each step's CPU time in this thread.
    """
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    took: list[float] = []
    d = ampdiag.diagnose(
        out=out, report=False, tensorboard=False, console=False, profile_long_step_s=LONG_S
    )
    warned = pytest.warns(RuntimeWarning, match="1 step recorded")
    with warned if pause_s else contextlib.nullcontext(), d:
        for _ in range(steps):
            t0 = time.thread_time()
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            busy(pause_s)
            time.sleep(wait_s)
            opt.step()
            took.append(time.thread_time() - t0)
    return d, took


def profiler_steps(out: Path) -> dict[str, float]:
    """The trace's ``ProfilerStep#N`` events: name -> duration (s)."""
    (trace,) = (out / "trace").glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return {
        e["name"]: e["dur"] / 1e6
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    }


def test_long_steps_record_one_step_and_a_warning_says_so(tmp_path: Path) -> None:
    d, took = run(tmp_path / "long", pause_s=LONG_S + 0.1)
    assert took[1] > LONG_S  # the step before the window (skip 1, warm-up 1), as measured
    recorded = profiler_steps(tmp_path / "long")
    assert list(recorded) == ["ProfilerStep#2"]
    prof = d.session.section("profiler")
    assert prof["recorded_steps"] == [2]
    (warning,) = [w for w in d.run.warnings if w.startswith("1 step recorded")]
    shown = float(warning.split("steps take ")[1].split(" s of CPU time")[0])
    assert shown == pytest.approx(took[1], abs=0.1)  # the step time the test measured


def test_short_steps_record_the_configured_window(tmp_path: Path) -> None:
    # steps that wait (a data loader, or another process holding the core) past the limit in
    # wall time but work little: the configured window, the same on a busy machine as idle
    d, took = run(tmp_path / "short", pause_s=0.0, wait_s=LONG_S + 0.1)
    assert max(took[:2]) < LONG_S  # the premise: the steps' own work is short
    assert sorted(profiler_steps(tmp_path / "short")) == [f"ProfilerStep#{i}" for i in (2, 3, 4)]
    assert d.session.section("profiler")["recorded_steps"] == [2, 3, 4]
    assert not [w for w in d.run.warnings if "step recorded" in w]


def count_ops(model: nn.Module, x: torch.Tensor) -> int:
    """ATen ops of one forward + backward, counted by a dispatch mode of the test's own."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        model(x).sum().backward()
    model.zero_grad()
    return Count.n


def test_a_step_of_many_ops_records_one_step_and_says_how_many(tmp_path: Path) -> None:
    # a deep stack of tiny layers: thousands of ops a step, each cheap (milliseconds of CPU
    # time, far under the long-step limit), each a dozen profiler events the exit pays for
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(300)])
    x = torch.randn(4, 2)
    ops = count_ops(model, x)
    assert ops > 2500  # the premise: well over the 2,000 a step that records one
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    took: list[float] = []
    d = ampdiag.diagnose(out=tmp_path / "heavy", report=False, tensorboard=False, console=False)
    with pytest.warns(RuntimeWarning, match="1 step recorded"), d:
        for _ in range(6):
            t0 = time.thread_time()
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            took.append(time.thread_time() - t0)
    assert max(took[:2]) < 2.0  # not the long-step limit: the op count decided
    assert list(profiler_steps(tmp_path / "heavy")) == ["ProfilerStep#2"]
    assert d.session.section("profiler")["recorded_steps"] == [2]
    (warning,) = [w for w in d.run.warnings if w.startswith("1 step recorded")]
    shown = int(warning.split(" ran ")[1].split(" ATen ops")[0].replace(",", ""))
    assert shown == pytest.approx(ops, rel=0.01)  # the ops the test counted in such a step
