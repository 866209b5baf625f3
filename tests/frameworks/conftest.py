"""Real framework runs under diagnose(): Hugging Face Trainer, Lightning, Accelerate.

The frameworks are the ``frameworks`` extra (``pip install -e .[frameworks]``, which
scripts/setup_env.sh installs); each test module skips itself when its framework is missing.
Tiny models built from configs, synthetic data, the CPU, a few steps: each test asserts what
ampdiag says against the framework's own record of the run (its step counter, its autocast).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

#: Outputs nobody reads here are off; the profiler records one step after one warm-up step.
SETTINGS: dict[str, Any] = {
    "report": False,
    "tensorboard": False,
    "console": False,
    "profile_skip": 0,
    "profile_warmup": 1,
    "profile_active": 1,
    # Every step asked for is recorded, however long a busy machine makes it: these tests
    # count the profiled steps (the one-step fallback is tests/collectors/test_long_steps.py's).
    "profile_long_step_s": 0,
    "speed_probe_repeats": 1,
}


def autocast_now() -> str | None:
    """The CPU autocast state as the framework set it ("cpu:bfloat16"), read independently."""
    if not torch.is_autocast_enabled("cpu"):
        return None
    return "cpu:" + str(torch.get_autocast_dtype("cpu")).removeprefix("torch.")


class AutocastRecorder:
    """The framework's truth: the autocast state at each forward of one submodule."""

    def __init__(self, module: torch.nn.Module) -> None:
        states: list[str | None] = []
        self.states = states
        # A plain function over the list, not a bound method: a deep copy of the model (the
        # speed probe runs on one) keeps calling it, where it would copy a bound method's
        # recorder and record into the copy.
        self._handle = module.register_forward_pre_hook(
            lambda module, args: states.append(autocast_now())
        )

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.states:
            out[s or "none"] = out.get(s or "none", 0) + 1
        return out

    def close(self) -> None:
        self._handle.remove()


@pytest.fixture(autouse=True)
def _seeded() -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def micro_batches(session: Any) -> list[int | None]:
    """Micro-batches per step as the step records say (None where one carries none)."""
    return [s.get("micro_batches") for s in session.steps]


def assert_attribution(session: Any, cpu: dict[int, list[float]], profiled: int) -> None:
    """The profiled steps' forward and backward time against the thread CPU time the test
    measured around those calls in the same steps (``cpu[step] = [forward_s, backward_s]``,
    `time.thread_time`).

    Summed over several profiled steps, not a share of one step, and CPU time, not wall time:
    on a loaded machine a preemption lands in one category and moves the shares, while the
    attribution must not. The profiler's wall-clock spans hold the CPU time and any waiting
    inside them, not the Python between ops (left to "other"); measured 0.59x-2.9x the CPU
    time on a loaded 2-core machine (wall time: down to 0.34x), so half must be attributed.
    """
    rows = session.sections["profiler"]["breakdown"]["steps"]
    assert [r["step"] for r in rows] == list(range(1, 1 + profiled))
    assert all(r["forward_us"] > 0 and r["backward_us"] > 0 for r in rows)
    for i, phase in enumerate(("forward", "backward")):
        attributed = sum(r[f"{phase}_us"] for r in rows) / 1e6
        measured = sum(cpu[r["step"]][i] for r in rows)
        assert attributed > 0.5 * measured, (phase, attributed, measured)


@pytest.fixture
def accelerate_state() -> Iterator[Any]:
    """Accelerate, its process-wide state reset before and after (each test its own run)."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield accelerate
    AcceleratorState._reset_state(reset_partial_state=True)
