"""What every collector is: a small object with lifecycle callbacks and one Session section.

A collector watches one thing in a live run. `diagnose()` calls its callbacks in this order:

    start(run)                       once, before the user's first step
    on_model(run, model)             when the model is known (given, or found on first forward)
    on_optimizer(run, optimizer)     when an optimizer is known (given, or found on first step)
    before_backward(run, tensor)     before every Tensor.backward, with the tensor (its graph)
    after_backward(run, index)       after each backward pass reached the model's first
                                     trainable parameter; index counts them in the step from 0
    on_loss(run, loss, from_scaler)  a loss about to be backpropagated (live; from_scaler: the
                                     unscaled loss given to GradScaler.scale)
    before_optimizer_step(run, opt)  before every optimizer.step() (grads final, maybe unscaled)
    after_optimizer_step(run, opt)   after every optimizer.step() that ran (not one a GradScaler
                                     skipped), before the step boundary it may make
    on_step_end(run, step)           at each step boundary (after optimizer.step() or d.step())
    stop(run)                        once, on exit, error or not; must remove all its hooks
    after_stop(run)                  once, after every collector stopped (no hook of ours left)
    section()                        its JSON section for the Session, or None for nothing

Collectors share facts only through typed `RunContext` fields, never through each other, so
the order of the collector list does not matter (except that a collector with
``step_end_last`` gets ``on_step_end`` after the others).

A collector never renders and never changes the user's numbers. Callbacks must be cheap on
steps that are not sampled (`run.is_sampled(step)`).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ampdiag.config import DiagnoseConfig, is_profiled_step, is_sampled_step

#: Called before every ``GradScaler.step(optimizer)`` with the scaler and the optimizer.
ScalerStepListener = Callable[[Any, torch.optim.Optimizer], None]

log = logging.getLogger("ampdiag")


@dataclass(eq=False)  # one object per run: compared by identity
class RunContext:
    """What collectors share about the live run.

    Attributes:
        out: The output folder.
        config: The settings.
        models: Models given or found, root modules first.
        optimizers: Optimizers given or found.
        scaler: The GradScaler given or found, if any.
        step: Index of the step in progress (from 0; from ``first_step`` in a window).
        first_step: The run-wide index of the block's first step: 0, or where a window of
            steps began (``DiagnoseConfig.steps``). The step settings (``profile_skip``,
            ``precision_step``, the sampling schedule) count from it: `window_step`.
        autocast: Autocast states seen at the model's forward: "device:dtype" -> count.
        device_type: "cuda" when CUDA work was seen, else "cpu".
        profile: The torch.profiler profile of the recorded window, once its trace is ready
            (set by the profiler collector; the memory collector reads the same profile
            rather than running a second profiler).
        trace_files: The Kineto trace files this run wrote (set when the profiler stops).
        traces: The trace files read so far (`read_trace`), until the session is built.
        block_raised: Whether the user's block raised; None until the block has ended.
        before_scaler_step: Listeners the scaler collector calls before ``GradScaler.step``
            (the gradients collector reads the still-scaled gradients there).
        numerics_errors: Failures of the numerics observers (at most 10, kept in the
            scaler section), so that a broken observation is reported, not silent.
        memory_probes: Results of `ampdiag.memory_probe` run inside this block.
        thread: The thread that entered the block: the only one whose training it observes.
        warnings: What the session's report must say went unobserved or wrong (`warn`).
        profile_active: The steps the profiler records when its window was shortened
            (``DiagnoseConfig.profile_long_step_s``), else None: ``config.profile_active``.
        audited_ops: The precision audit's step (run-wide) and the ATen ops it counted in it,
            once that step's audit has ended: the profiler's window is decided from it.
        framework: The training framework whose loop called the model or the optimizer
            (`ampdiag.compat.frameworks.calling_framework`), once found; None before or where
            there is none.
        found_in_forward: Ids of the models found on their first forward (discovery): that
            forward began before any collector's hook on them was registered.
    """

    out: Path
    config: DiagnoseConfig
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    scaler: Any = None
    step: int = 0
    first_step: int = 0
    autocast: dict[str, int] = field(default_factory=dict)
    device_type: str = "cpu"
    profile: torch.profiler.profile | None = None
    trace_files: list[Path] = field(default_factory=list)
    block_raised: bool | None = None
    before_scaler_step: list[ScalerStepListener] = field(default_factory=list)
    numerics_errors: list[str] = field(default_factory=list)
    memory_probes: list[dict[str, Any]] = field(default_factory=list)
    thread: int = field(default_factory=threading.get_ident)
    warnings: list[str] = field(default_factory=list)
    profile_active: int | None = None
    audited_ops: tuple[int, int] | None = None
    framework: dict[str, Any] | None = None
    found_in_forward: set[int] = field(default_factory=set)
    traces: dict[Path, Any] = field(default_factory=dict, repr=False)

    def read_trace(self, path: Path, source: Path | None = None) -> Any:
        """One of this run's trace files, read once for every section that needs it.

        The memory timeline and the profiler's step breakdown each need the whole trace: one
        read (decoding it) less at the user's exit; ``source``, its JSON before the gzip. The
        caller must not change what it gets; `Diagnosis` forgets the reads once it is built.
        """
        from ampdiag.trace.reader import read_trace

        if path not in self.traces:
            self.traces[path] = read_trace(source or path)
            self.traces[path].path = path
        return self.traces[path]

    def on_block_thread(self) -> bool:
        """Whether the caller runs in the block's thread (hooks fire in any thread)."""
        return threading.get_ident() == self.thread

    def warn(self, message: str, *, user: bool = False) -> None:
        """Notes ``message`` for the session; ``user=True`` also issues a Python warning.

        The Python warning is for what changes what the user gets (a part of the run that was
        not observed), so it shows without reading the report.
        """
        if message in self.warnings:
            return
        self.warnings.append(message)
        log.warning(message)
        if user:
            warnings.warn(f"ampdiag: {message}", RuntimeWarning, stacklevel=2)

    def window_step(self, step: int | None = None) -> int:
        """A step's index counted from the block's first step (default: the step in progress).

        What the step settings are compared with: ``profile_skip=1`` skips the window's first
        step, whatever its run-wide number.
        """
        return (self.step if step is None else step) - self.first_step

    def is_sampled(self, step: int | None = None) -> bool:
        """Whether the sampled collectors run on this step (default: the step in progress)."""
        return is_sampled_step(self.config, self.window_step(step), self.profile_active)

    def is_profiled(self, step: int | None = None) -> bool:
        """Whether the profiler records this step (default: the step in progress)."""
        return is_profiled_step(self.config, self.window_step(step), self.profile_active)

    @property
    def model(self) -> torch.nn.Module | None:
        """The main model (the first found), if any."""
        return self.models[0] if self.models else None


class Collector:
    """Base class: every callback is a no-op, so a collector overrides only what it needs."""

    #: The Session section this collector writes (a top-level key of session.json); its type
    #: is the return annotation of `section` (a TypedDict of `ampdiag.schema`).
    name: str = ""
    #: The `DiagnoseConfig` flag that turns it on (None: always on; it may skip itself).
    enabled_by: ClassVar[str | None] = None

    @classmethod
    def from_config(cls, config: DiagnoseConfig) -> Collector:
        """The collector diagnose() attaches for ``config`` (most take no settings)."""
        return cls()

    #: Watches every step of a long run, also outside a window of steps (``steps=``,
    #: ``trigger=``): cheap enough to leave on, and what it looks for (the first inf/NaN) may
    #: come before the window opens. Such a collector runs in a block of its own for the whole
    #: run (`window.WindowDriver`), and the window's session holds its section.
    run_wide: ClassVar[bool] = False

    #: Called after every other collector at a step boundary. The profiler opens the next
    #: profiled step there, so the others' end-of-step work never lands inside a profiled step.
    step_end_last: bool = False

    def start(self, run: RunContext) -> None:
        """Called once before the first step."""

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Called when a model becomes known."""

    def on_optimizer(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Called when an optimizer becomes known."""

    def before_backward(self, run: RunContext, tensor: torch.Tensor) -> None:
        """Called before every ``Tensor.backward`` with the tensor (never change it)."""

    def after_backward(self, run: RunContext, index: int) -> None:
        """Called after each backward pass of the step (``index`` from 0: the micro-batch)."""

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        """Called with each loss before its backward (the live tensor: read, never modify)."""

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Called before every optimizer step."""

    def after_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Called after every optimizer step that ran (``run.step`` is still its step)."""

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Called at each step boundary with the index of the step that ended."""

    def stop(self, run: RunContext) -> None:
        """Called once on exit, error or not. Must remove every hook, mode and patch.

        Runs with Ctrl-C deferred (the removal must complete), so it must be quick.
        """

    def after_stop(self, run: RunContext) -> None:
        """Called once after every collector's stop(): extra work that no hook may observe.

        Work that may take a while (a probe); not called when a second Ctrl-C came during the
        exit.
        """

    def section(self) -> Mapping[str, Any] | None:
        """Returns this collector's JSON section, or None to write nothing."""
        return None


_running: list[RunContext] = []  # diagnose() blocks in progress, the innermost last


def enter_run(run: RunContext) -> None:
    """Marks ``run`` as in progress (diagnose() on entering its block)."""
    _running.append(run)


def leave_run(run: RunContext) -> None:
    """Marks ``run`` as over (diagnose() on exit, error or not)."""
    if run in _running:
        _running.remove(run)


def running() -> RunContext | None:
    """The innermost diagnose() block of this thread, if any (what `memory_probe` records into)."""
    me = threading.get_ident()
    return next((run for run in reversed(_running) if run.thread == me), None)


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


def graph_nodes(root: Any) -> Iterator[Any]:
    """Every autograd node reachable from ``root`` (public ``next_functions``), once each."""
    seen: dict[int, Any] = {}  # holds the nodes, so that no id is reused during the walk
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        yield node
        stack.extend(fn for fn, _ in node.next_functions)
