"""What every collector is: a small object with lifecycle callbacks and one Session section.

A collector watches one thing in a live run. `diagnose()` calls its callbacks in this order:

    start(run)                       once, before the user's first step
    on_model(run, model)             when the model is known (given, or found on first forward)
    on_optimizer(run, optimizer)     when an optimizer is known (given, or found on first step)
    before_optimizer_step(run, opt)  before every optimizer.step() (grads final, maybe unscaled)
    on_step_end(run, step)           at each step boundary (after optimizer.step() or d.step())
    stop(run)                        once, on exit, error or not; must remove all its hooks
    section()                        its JSON section for the Session, or None for nothing

A collector never renders and never changes the user's numbers. Callbacks must be cheap on
steps that are not sampled (`run.is_sampled(step)`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class DiagnoseConfig:
    """Settings of one diagnose() run (saved in the session's ``config``).

    Attributes:
        profile: Run torch.profiler at all.
        profile_skip: Steps skipped at the start before the profiler records (warm-up).
        profile_warmup: Profiler warm-up steps (traced but discarded), after the skip.
        profile_active: Steps the profiler records.
        record_shapes: Record input shapes in the trace.
        profile_memory: Record allocator events in the trace.
        with_stack: Record Python stacks in the trace (costly).
        sample_every: Which steps the sampled (more expensive) collectors run on: the numerics
            statistics (gradients, activations) and the speed probe's input capture. ``N > 0``:
            exactly every N-th step (0, N, 2N, ...), profiled steps included. ``0`` (the
            default): automatic, see ``sample_first`` and ``sample_period``.
        sample_first: Automatic schedule: every one of the first ``sample_first`` steps is
            sampled, so a short run is measured on every step ...
        sample_period: ... and after them every ``sample_period``-th step (steps
            ``sample_first``, ``sample_first + sample_period``, ...), which keeps the
            amortised cost of the statistics within a few percent of the step time. Under
            the automatic schedule the steps the profiler records (``profile_skip +
            profile_warmup`` up to ``+ profile_active``) are never sampled, so the trace
            shows the user's step unperturbed by ampdiag's own statistics.
            The scaler's telemetry (scale, skipped steps) covers every step whatever the
            schedule; to locate a NaN's origin at the very step it first appears, use
            ``sample_every=1``.
        max_steps_recorded: Cap on per-step records kept (the first ones are kept).
        report: Render report.html (and the console summary) on exit.
        tensorboard: Write TensorBoard event files on exit.
        console: Print the short console summary on exit.
        memory: Run the memory collector (model state, timeline by category, CUDA snapshot).
        memory_history: On CUDA, record the allocator history and snapshot it at the end.
        memory_history_max_entries: Allocator events kept by the CUDA history (a ring).
        memory_target_batch: Effective batch to plan micro-batches and accumulation for.
        memory_limit_bytes: Memory budget for the plan (default: the device's capacity).
        numerics: Collect gradient statistics, activation range/underflow, NaN origin and
            GradScaler telemetry (collectors gradients, activations, scaler).
        numerics_sample_elements: Values examined per tensor for the exponent histograms
            (runs of 16 consecutive values spread evenly over the tensor; 0 = all). Norms,
            the forward range and the scaler's inf checks always use all values.
        activation_every: Period of the activation hooks (0 = every sampled step).
        precision: Audit the dtype of every op of one step (forward and backward).
        precision_step: The step the precision audit runs on (default the second, index 1:
            the first pays for lazy initialisation).
        speed_probe: At the end of the run, time the model's forward + backward in FP32 and
            under the run's autocast (see collectors/speed_probe.py; changes nothing).
        speed_probe_repeats: Interleaved timed pairs of the speed probe.
    """

    profile: bool = True
    profile_skip: int = 1
    profile_warmup: int = 1
    profile_active: int = 3
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    sample_every: int = 0
    sample_first: int = 10
    sample_period: int = 20
    max_steps_recorded: int = 100_000
    report: bool = True
    tensorboard: bool = True
    console: bool = True
    memory: bool = True
    memory_history: bool = True
    memory_history_max_entries: int = 100_000
    memory_target_batch: int | None = None
    memory_limit_bytes: int | None = None
    numerics: bool = True
    numerics_sample_elements: int = 1024
    activation_every: int = 0
    precision: bool = True
    precision_step: int = 1
    speed_probe: bool = True
    speed_probe_repeats: int = 3


def is_sampled_step(config: DiagnoseConfig, step: int) -> bool:
    """Whether ``step`` is sampled under ``config`` (see `DiagnoseConfig.sample_every`).

    ``sample_every=N > 0``: every N-th step. ``0`` (automatic): every one of the first
    ``sample_first`` steps, then every ``sample_period``-th, never a step the profiler records.
    """
    if config.sample_every > 0:
        return step % config.sample_every == 0
    if config.profile:
        first = config.profile_skip + config.profile_warmup
        if first <= step < first + config.profile_active:
            return False
    if step < config.sample_first:
        return True
    return (step - config.sample_first) % max(1, config.sample_period) == 0


@dataclass
class RunContext:
    """What collectors share about the live run.

    Attributes:
        out: The output folder.
        config: The settings.
        models: Models given or found, root modules first.
        optimizers: Optimizers given or found.
        scaler: The GradScaler given or found, if any.
        step: Index of the step in progress (from 0).
        autocast: Autocast states seen at the model's forward: "device:dtype" -> count.
        device_type: "cuda" when CUDA work was seen, else "cpu".
        extra: Free slots collectors may share facts through (documented by the writer).
    """

    out: Path
    config: DiagnoseConfig
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    scaler: Any = None
    step: int = 0
    autocast: dict[str, int] = field(default_factory=dict)
    device_type: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)

    def is_sampled(self, step: int | None = None) -> bool:
        """Whether the sampled collectors run on this step (default: the step in progress)."""
        return is_sampled_step(self.config, self.step if step is None else step)

    @property
    def model(self) -> torch.nn.Module | None:
        """The main model (the first found), if any."""
        return self.models[0] if self.models else None


class Collector:
    """Base class: every callback is a no-op, so a collector overrides only what it needs."""

    #: The Session section this collector writes (a top-level key of session.json).
    name: str = ""

    def start(self, run: RunContext) -> None:
        """Called once before the first step."""

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Called when a model becomes known."""

    def on_optimizer(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Called when an optimizer becomes known."""

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Called before every optimizer step."""

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Called at each step boundary with the index of the step that ended."""

    def stop(self, run: RunContext) -> None:
        """Called once on exit, error or not. Must remove every hook, mode and patch."""

    def section(self) -> dict[str, Any] | None:
        """Returns this collector's JSON section, or None to write nothing."""
        return None


_internal = threading.local()


class _InternalWork:
    """The context manager `internal_work()` returns (cheaper than a generator in hooks)."""

    __slots__ = ("_previous",)

    def __enter__(self) -> None:
        self._previous = getattr(_internal, "active", False)
        _internal.active = True

    def __exit__(self, *exc: object) -> None:
        _internal.active = self._previous


def internal_work() -> _InternalWork:
    """Marks tensor work done by ampdiag itself (statistics in hooks), not by the user's model.

    Observers of the user's ops (the precision audit's dispatch mode) skip what runs inside, so
    one collector's measurements never show up as the model's ops in another's. Use as
    ``with internal_work(): ...``.
    """
    return _InternalWork()


def is_internal_work() -> bool:
    """Whether the current thread is inside `internal_work()`."""
    return bool(getattr(_internal, "active", False))


def tensors_in(value: Any, max_depth: int = 4) -> Iterator[torch.Tensor]:
    """The tensors in a module's inputs or outputs, in order.

    Looks through nested lists, tuples, dicts and dataclasses (such as Hugging Face's
    ``ModelOutput``), at most ``max_depth`` levels down.
    """
    if isinstance(value, torch.Tensor):
        yield value
    elif max_depth <= 0:
        return
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v, max_depth - 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v, max_depth - 1)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from tensors_in(getattr(value, name, None), max_depth - 1)
