"""`DiagnoseConfig`: every setting of a diagnose() run, typed and documented in one place.

Kept apart from the collectors so that the public surface, the CLI and the renderers can read
settings without importing torch.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import TypedDict


@dataclass
class DiagnoseConfig:
    """Settings of one diagnose() run (saved in the session's ``config``).

    Attributes:
        profile: Run torch.profiler at all.
        profile_skip: Steps skipped at the start before the profiler records (warm-up).
        profile_warmup: Profiler warm-up steps (traced but discarded), after the skip.
        profile_active: Steps the profiler records.
        profile_long_step_s: A step before the profiler's window (the last skipped or warm-up
            step) that takes more than this many seconds of CPU time in the thread that trains
            (the machine's load does not stretch it): the profiler records one step rather
            than ``profile_active`` (a run warning says so: "1 step recorded: steps take N s
            of CPU time"). A long step of small ops (an LBFGS step's 20 closure evaluations
            over an unrolled LSTM) is millions of profiler events, each recorded step tens of
            seconds of the user's exit (torch's own trace processing and export, then reading
            it back). So does a step of over 2,000 ATen ops where the precision audit counted
            them (``precision_step`` is that step, as by default): "1 step recorded: step N
            ran M ATen ops". ``0`` turns both off; without a step before the window
            (``profile_skip = profile_warmup = 0``) they never apply.
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
        max_steps_recorded: Most per-step records kept (steps, the GradScaler's history): past
            it every other record is dropped and only every 2nd, 4th, ... step is recorded
            from then on, so the records span the whole run and a long run stays flat.
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
        sentinel: Watch every step for the first inf/NaN (loss, each module's output, the
            gradients in the backward) with the module and step it came from
            (collectors/sentinel.py; one reduction per module output and gradient, one small
            transfer per step).
        numerics_sample_elements: Values examined per tensor for the exponent histograms
            (runs of 16 consecutive values spread evenly over the tensor; 0 = all). Norms,
            the forward range and the scaler's inf checks always use all values.
        activation_every: Period of the activation hooks (0 = every sampled step).
        precision: Audit the dtype of every op of one step (forward and backward).
        precision_step: The step the precision audit runs on (default the second, index 1:
            the first pays for lazy initialization).
        speed_probe: At the end of the run, time the model's forward + backward in FP32 and
            under the run's autocast (see collectors/speed_probe.py; changes nothing).
        speed_probe_repeats: Timed rounds of each precision at least, within the A/B's
            budget (it goes on until each median is known to within 5%; FP32 and the run's
            precision are timed three times whatever the budget, so every figure has a spread
            that one stalled sample cannot move).
        precision_ab_budget_s: The speed probe is ``ampdiag.compare`` on the run's model and
            batch: every precision the device runs (time, memory, error against FP32),
            spending at most this many seconds and at most 5% of the block's wall time past
            its least version; a precision whose first pass shows that timing it would
            overrun that is left untimed, with the reason. 0: FP32 and the run's precision
            only (the A/B off).
        fp8: Add the FP8 readiness of every ``nn.Linear`` to the precision A/B (which layers
            can train in FP8, with the torchao filter; see sources/live/fp8.py), inside its
            budget. ``None`` (default): only on a GPU with FP8 (compute capability >= 8.9).
        fp8_recipe: Its scaling recipe: ``tensorwise``, ``rowwise`` or ``delayed``.
        steps: Diagnose only a window of a long run: ``(A, B)`` watches steps ``A`` up to
            ``B`` (``B`` excluded; steps counted from 0 as the block's step boundaries
            come, ``A:B`` on the command line). Before and after the window only the step
            boundaries are counted (one callback per step, no module hook, no profiler), and
            the session holds the window's steps under their run-wide numbers; every other
            step setting (``profile_skip``, ``precision_step``, ``sample_every``) counts
            from ``A``. ``diagnose(steps=range(A, B))`` is the same. ``None``: every step.
        trigger: Open the window when something happens instead of at fixed steps:
            ``loss-spike`` watches each step's loss (one host read per step) and, when it
            is not finite or exceeds median + 6 x max(1.4826 x MAD, 5% of the median) of
            the last 32 finite losses (8 at least; see sources/live/loss_spike.py),
            diagnoses the next ``trigger_steps`` steps (one window per block). With
            ``steps`` too, only a spike inside ``steps`` opens it.
        trigger_steps: Steps the trigger's window lasts.
    """

    profile: bool = True
    profile_skip: int = 1
    profile_warmup: int = 1
    profile_active: int = 3
    profile_long_step_s: float = 2.0
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    sample_every: int = 0
    sample_first: int = 10
    sample_period: int = 20
    max_steps_recorded: int = 10_000
    report: bool = True
    tensorboard: bool = True
    console: bool = True
    memory: bool = True
    memory_history: bool = True
    memory_history_max_entries: int = 100_000
    memory_target_batch: int | None = None
    memory_limit_bytes: int | None = None
    numerics: bool = True
    sentinel: bool = True
    numerics_sample_elements: int = 1024
    activation_every: int = 0
    precision: bool = True
    precision_step: int = 1
    speed_probe: bool = True
    speed_probe_repeats: int = 3
    precision_ab_budget_s: float = 20.0
    fp8: bool | None = None
    fp8_recipe: str = "tensorwise"
    steps: tuple[int, int] | None = None
    trigger: str | None = None
    trigger_steps: int = 10


class Settings(TypedDict, total=False):
    """Any `DiagnoseConfig` field, as a keyword of ``diagnose(**overrides)`` (checked by mypy)."""

    profile: bool
    profile_skip: int
    profile_warmup: int
    profile_active: int
    profile_long_step_s: float
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    sample_every: int
    sample_first: int
    sample_period: int
    max_steps_recorded: int
    report: bool
    tensorboard: bool
    console: bool
    memory: bool
    memory_history: bool
    memory_history_max_entries: int
    memory_target_batch: int | None
    memory_limit_bytes: int | None
    numerics: bool
    sentinel: bool
    numerics_sample_elements: int
    activation_every: int
    precision: bool
    precision_step: int
    speed_probe: bool
    speed_probe_repeats: int
    precision_ab_budget_s: float
    fp8: bool | None
    fp8_recipe: str
    steps: tuple[int, int] | range | None
    trigger: str | None
    trigger_steps: int


def is_profiled_step(config: DiagnoseConfig, step: int, active: int | None = None) -> bool:
    """Whether the profiler records ``step`` (after ``profile_skip + profile_warmup`` steps).

    ``active``: the steps it records when not ``profile_active`` (a window shortened for long
    steps, `RunContext.profile_active`).
    """
    first = config.profile_skip + config.profile_warmup
    n = config.profile_active if active is None else active
    return config.profile and first <= step < first + n


def is_sampled_step(config: DiagnoseConfig, step: int, active: int | None = None) -> bool:
    """Whether ``step`` is sampled under ``config`` (see `DiagnoseConfig.sample_every`).

    ``sample_every=N > 0``: every N-th step. ``0`` (automatic): every one of the first
    ``sample_first`` steps, then every ``sample_period``-th, never a step the profiler records
    (``active``: as in `is_profiled_step`).
    """
    if config.sample_every > 0:
        return step % config.sample_every == 0
    if is_profiled_step(config, step, active):
        return False
    if step < config.sample_first:
        return True
    return (step - config.sample_first) % max(1, config.sample_period) == 0


def field_docs() -> dict[str, str]:
    """Each setting's documentation from `DiagnoseConfig`'s docstring, as one line per field.

    The docstring is the one place a setting is explained; the command line's ``--help``
    reads it from here rather than keeping a second copy.
    """
    doc = inspect.getdoc(DiagnoseConfig) or ""
    body = doc.split("Attributes:", 1)[-1]
    docs: dict[str, str] = {}
    name = ""
    for line in body.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            name = match.group(1)
            docs[name] = match.group(2).strip()
        elif name and line.strip():
            docs[name] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in docs.items()}


TRIGGERS = ("loss-spike",)


def window_steps(value: object) -> tuple[int, int] | None:
    """``steps`` as `DiagnoseConfig` keeps it: ``(A, B)`` with ``0 <= A < B``, or None.

    Accepts ``(A, B)``, ``[A, B]``, ``range(A, B)`` (step 1) and the command line's ``"A:B"``.

    Raises:
        ValueError: Not a window of at least one step.
    """
    if value is None:
        return None
    if isinstance(value, str):
        first, sep, last = value.partition(":")
        if not sep:
            raise ValueError(f"steps {value!r}: expected A:B (steps A up to B, B excluded)")
        try:
            value = (int(first), int(last))
        except ValueError:
            raise ValueError(f"steps {value!r}: A and B must be integers") from None
    if isinstance(value, range):
        if value.step != 1:
            raise ValueError(f"steps {value!r}: a window is a range with step 1")
        value = (value.start, value.stop)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"steps {value!r}: expected (A, B), range(A, B) or 'A:B'")
    start, stop = int(value[0]), int(value[1])
    if not 0 <= start < stop:
        raise ValueError(f"steps {value!r}: need 0 <= A < B (steps A up to B, B excluded)")
    return start, stop
