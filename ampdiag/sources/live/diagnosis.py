"""``ampdiag.diagnose()``: the context manager that watches a training run and writes the report.

(The module is ``diagnosis``, not ``diagnose``, so that it never shadows the function.)

On enter it checks the output folder, attaches the discovery hooks and the collectors; at each
step boundary it records the step and lets the collectors advance; on exit, error or not, it
removes every hook, writes the session and renders the report. The user's exception is theirs:
it propagates unchanged after the session is written with ``status: "error"``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from ampdiag._layout import REPORT_FILE, check_writable
from ampdiag._version import __version__
from ampdiag.compat import scaler as compat_scaler
from ampdiag.compat.dtensor import fsdp_mixed_precision
from ampdiag.compat.frameworks import calling_framework
from ampdiag.config import TRIGGERS, Settings, window_steps
from ampdiag.session import Session
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import (
    Collector,
    DiagnoseConfig,
    RunContext,
    default_collectors,
)
from ampdiag.sources.live.collectors.base import enter_run, leave_run
from ampdiag.sources.live.discovery import Discovery, frozen_holders, split_parameters
from ampdiag.sources.live.environment import describe_environment, distributed_info
from ampdiag.sources.live.shielding import ImportFilters, describe_exception, sigint_deferred
from ampdiag.sources.live.steps import StepLog
from ampdiag.sources.live.window import StepWindow, WindowDriver
from ampdiag.sources.live.windowed import WindowedDiagnosis

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations are not evaluated at run time

log = logging.getLogger("ampdiag")

DEFAULT_ROOT = Path("reports")


def default_out() -> Path:
    """A fresh folder under reports/ named by the time, e.g. reports/run-20261130-101500."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = DEFAULT_ROOT / f"run-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = DEFAULT_ROOT / f"run-{stamp}-{n}"
    return out


def rank_folder(out: Path) -> Path:
    """``out``, or its ``rank-N/`` in a distributed run: one session per rank, side by side."""
    ranks = distributed_info()
    return out / f"rank-{ranks['rank']}" if ranks["world_size"] > 1 else out


# What a torch.compile'd region hides (module callbacks are not traced: see global_hooks).
COMPILED_REGION = (
    "part of the model ran inside torch.compile: the modules in the compiled region were not "
    "observed one by one (the sentinel's per-module origin, activation statistics and the "
    "precision audit's per-module attribution); the loss, gradients, GradScaler, profiler "
    "and memory figures are unaffected"
)


class Diagnosis:
    """The handle ``diagnose()`` yields.

    Attributes:
        out: The output folder.
        session: The Session, set on exit.
        run: What the collectors share about the live run (models, optimizers, scaler, step).
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        scaler: Any,
        out: str | Path | None,
        config: DiagnoseConfig,
        collectors: list[Collector] | None,
        *,
        first_step: int = 0,
        window: StepWindow | None = None,
        after_step: Callable[[int], None] | None = None,
        borrowed: Sequence[Collector] = (),
    ) -> None:
        # Before the collectors are made: their imports (sympy, numpy) may add warning filters.
        self._filters = ImportFilters()
        self.out = rank_folder(Path(out) if out is not None else default_out())
        self.config = config
        self.session: Session | None = None
        self.run = RunContext(out=self.out, config=config, step=first_step, first_step=first_step)
        self._window = window
        self._after_step = after_step
        # A window's block: the run-wide collectors (the sentinel) watch the whole run in a
        # block of their own (`window.WindowDriver`); this block's session holds their sections.
        self._borrowed = list(borrowed)
        self._given = (model, optimizer, scaler)
        chosen = collectors if collectors is not None else default_collectors(config)
        # stable: the profiler's step() (which opens the next profiled step) comes last
        self._collectors = sorted(chosen, key=lambda c: c.step_end_last)
        self._callees: dict[str, list[Collector]] = {}  # method -> collectors (`_each`)
        self._discovery: Discovery | None = None
        self._steps = StepLog(config.max_steps_recorded)
        self._step_start = 0.0
        self._backward_passes = 0  # in the step in progress
        # the whole block's, to tell "no step boundary" from "too short" (the rules read them)
        self._backward_calls = 0
        self._optimizer_steps = 0
        self._optimizer_depth = 0  # optimizer steps running (a wrapper's holds its inner one's)
        self._boundaries = 0
        self._manual_steps = False
        self._primary_optimizer: int | None = None
        self._scaler_in_use = False
        self._started = time.time()
        self._closed = False
        self._lock = threading.Lock()

    # --- public ---------------------------------------------------------------------------------

    def step(self) -> None:
        """Marks a step boundary by hand (for loops with no optimizer, or several per step).

        Once called, optimizer steps no longer end steps by themselves.
        """
        self._manual_steps = True
        self._end_step()

    @property
    def report_path(self) -> Path:
        """Where report.html is (or will be) written."""
        return self.out / REPORT_FILE

    # --- context manager ------------------------------------------------------------------------

    def __enter__(self) -> Diagnosis:
        check_writable(self.out)
        self._started = time.time()
        model, optimizer, scaler = self._given
        self.run.thread = threading.get_ident()  # the thread whose training the block observes
        global_hooks.block_started()
        global_hooks.reset_compiled_region()
        started: list[Collector] = []
        enter_run(self.run)
        try:
            self._discovery = Discovery(
                on_model=self._found_model,
                on_optimizer_pre=self._before_optimizer_step,
                on_optimizer_post=self._after_optimizer_step,
                on_loss=self._saw_loss,
                on_scaler=self._found_scaler,
                on_scaler_update=self._after_scaler_update,
                on_autocast=self._saw_autocast,
                on_backward=self._before_backward,
                on_accumulated=self._after_backward,
            )
            for collector in self._collectors:
                collector.start(self.run)
                started.append(collector)
            if scaler is not None:
                self._found_scaler(scaler)
            if model is not None:
                self._found_model(model)
            if optimizer is not None:
                self._found_optimizer(optimizer)
        except BaseException:
            self._collectors = started
            self._callees = {}
            self._teardown()
            raise
        self._step_start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # First take everything out of the user's process, then describe what happened,
        # defensively, and write what was collected.
        self.stop(exc is not None)
        self.finish(exc, tb)
        # Returning None lets the user's exception propagate unchanged (the same object).

    def stop(self, raised: bool) -> None:
        """Removes every hook and patch, with Ctrl-C deferred (the first half of the exit).

        Nothing the user's objects do and no second interrupt may leave a hook or patch
        behind; an interrupt that came meanwhile is raised once everything is removed.
        """
        with sigint_deferred() as deferred:
            broke = self._close(raised)
        deferred.deliver()  # a Ctrl-C during the removal: raised now, everything removed
        if broke is not None:
            raise broke

    def finish(self, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Writes the session and report of what was collected (the second half of the exit).

        Args:
            exc: The exception that ended the block, if any (its status and description).
            tb: Its traceback.
        """
        status = "ok"
        error = None
        if exc is not None:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
            error = describe_exception(exc, tb)
        try:
            self._after_stop()
            try:
                self.session = self._build_session(status, error)
            finally:
                self.run.traces.clear()  # the sections' shared reads of the trace, held no longer
            self._write_outputs()
        except Exception as failure:  # ampdiag's own bug must not replace the user's outcome
            print(
                f"ampdiag: could not write the report to {self.out}: {failure!r}", file=sys.stderr
            )
        finally:
            self._filters.remove_added()  # the renderers' imports too

    def _close(self, raised: bool) -> BaseException | None:
        """Ends a partial step and removes every hook and patch; returns an interrupt to re-raise.

        A partial step (the block ended between boundaries) is kept when it did something.
        """
        interrupt: BaseException | None = None
        if not raised and self._step_has_activity():
            try:
                self._end_step()
                self._boundaries -= 1  # the block's end, not a boundary the loop marked
            except BaseException as exc:  # a KeyboardInterrupt raised in a callback
                interrupt = exc
        self.run.block_raised = raised  # collectors' stop() may ask
        return self._teardown() or interrupt

    # --- callbacks from discovery ---------------------------------------------------------------

    def _found_model(self, model: torch.nn.Module) -> None:
        if any(m is model for m in self.run.models):
            return
        self.run.models.append(model)
        self._find_framework()
        if self._discovery is not None and self._discovery.discovering is model:
            self.run.found_in_forward.add(id(model))
        if self._discovery is not None:
            self._discovery.watch_root(model)
        if any(p.is_cuda for p in model.parameters()):
            self.run.device_type = "cuda"
        self._each("on_model", model)

    def _find_framework(self) -> None:
        """Reads the calling framework from the stack (a model or optimizer just found)."""
        if self.run.framework is None:
            self.run.framework = calling_framework()

    def _found_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for known in self.run.optimizers:  # a loop, not any(): no generator on every step
            if known is optimizer:
                return
        self.run.optimizers.append(optimizer)
        self._find_framework()
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
        self._each("on_optimizer", optimizer)

    def _found_scaler(self, scaler: Any) -> None:
        self._scaler_in_use = True
        if self.run.scaler is None:
            self.run.scaler = scaler

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._found_optimizer(optimizer)
        self._optimizer_depth += 1
        self._each("before_optimizer_step", optimizer)

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # a wrapper's step (ZeroRedundancyOptimizer) runs its inner optimizer's: one step
        self._optimizer_depth = max(0, self._optimizer_depth - 1)
        if self._optimizer_depth == 0:
            self._optimizer_steps += 1
        self._each("after_optimizer_step", optimizer)
        # With a GradScaler, scaler.update() ends the step: scaler.step() skips
        # optimizer.step() on inf/NaN, and a skipped step is still a step.
        if self._manual_steps or self._scaler_in_use:
            return
        if id(optimizer) == self._primary_optimizer:
            self._end_step()

    def _after_scaler_update(self, scaler: Any) -> None:
        if not self._manual_steps and scaler is self.run.scaler:
            self._end_step()

    def _saw_loss(self, loss: torch.Tensor, from_scaler: bool) -> None:
        self._steps.saw_loss(loss, from_scaler)
        self._each("on_loss", loss, from_scaler)

    def _before_backward(self, tensor: torch.Tensor) -> None:
        self._backward_calls += 1
        self._each("before_backward", tensor)

    def _after_backward(self) -> None:
        index = self._backward_passes
        self._backward_passes += 1
        self._each("after_backward", index)

    def _saw_autocast(self, state: str | None) -> None:
        key = state or "none"
        self.run.autocast[key] = self.run.autocast.get(key, 0) + 1

    # --- steps ------------------------------------------------------------------------------------

    def _step_has_activity(self) -> bool:
        return self._steps.has_activity()

    def _end_step(self) -> None:
        self._boundaries += 1
        now = time.perf_counter()
        step = self.run.step
        self._steps.end(
            step,
            now - self._step_start,
            self.run.is_profiled(step),
            self.run.is_sampled(step),
            micro_batches=self._backward_passes if self.run.models else None,
        )
        if step == self.run.first_step and self._discovery is not None:
            self._discovery.stop_searching_models()
        self._each("on_step_end", step)
        self.run.step = step + 1
        self._backward_passes = 0
        self._step_start = time.perf_counter()
        if self._after_step is not None:
            try:
                self._after_step(step)
            except Exception as exc:  # closing a window must never break the user's step
                self._warn(f"the step window failed after step {step}: {exc!r}")

    # --- collectors -------------------------------------------------------------------------------

    def _each(self, method: str, *args: Any) -> None:
        callees = self._callees.get(method)
        if callees is None:  # the collectors that do something there (a no-op costs a call)
            callees = self._callees[method] = [
                c
                for c in self._collectors
                if method in vars(c) or getattr(type(c), method) is not getattr(Collector, method)
            ]
        for collector in callees:
            try:
                getattr(collector, method)(self.run, *args)
            except Exception as exc:  # a collector bug must never break the user's training
                self._warn(f"collector {collector.name!r} failed in {method}: {exc!r}")

    def _warn(self, message: str) -> None:
        self.run.warn(message)

    def _teardown(self) -> BaseException | None:
        """Removes what this block installed; every part runs, whatever another one raises.

        Returns the first interrupt (a BaseException that is not an Exception) to re-raise
        once everything is removed; a collector's ordinary error is only noted.
        """
        with self._lock:
            if self._closed:
                return None
            self._closed = True
        interrupt: BaseException | None = None
        parts: list[tuple[str, Callable[[], None]]] = []
        if global_hooks.compiled_region_seen():
            self._warn(COMPILED_REGION)
        if self._discovery is not None:
            parts.append(("discovery", self._discovery.close))
        parts.append(("run registry", partial(leave_run, self.run)))
        for collector in reversed(self._collectors):
            parts.append((collector.name, partial(collector.stop, self.run)))
        parts.append(("global hooks", global_hooks.block_ended))
        parts.append(("warning filters", self._filters.remove_added))
        for name, stop in parts:
            try:
                stop()
            except Exception as exc:
                self._warn(f"collector {name!r} failed to stop: {exc!r}")
            except BaseException as exc:
                interrupt = interrupt or exc
        return interrupt

    def _after_stop(self) -> None:
        """The collectors' extra work after every hook is gone (the speed probe's forwards)."""
        for collector in self._collectors:
            try:
                collector.after_stop(self.run)
            except Exception as exc:
                self._warn(f"collector {collector.name!r} failed after stopping: {exc!r}")

    # --- outputs ----------------------------------------------------------------------------------

    def _build_session(self, status: str, error: dict[str, str] | None) -> Session:
        sections: dict[str, Any] = {}
        for collector in [*self._collectors, *self._borrowed]:
            try:
                section = collector.section()
            except Exception as exc:
                self._warn(f"collector {collector.name!r} failed to write its section: {exc!r}")
                continue
            if section is not None:
                sections[collector.name] = section
        sections["run"] = {
            "models": [_describe_model(m, self.run.optimizers) for m in self.run.models],
            "optimizers": [type(o).__name__ for o in self.run.optimizers],
            "scaler": _describe_scaler(self.run.scaler),
            "autocast_seen": self.run.autocast,
            "duration_s": time.time() - self._started,
            "warnings": list(self.run.warnings),
            "backward_calls": self._backward_calls,
            "optimizer_steps": self._optimizer_steps,
            "step_boundaries": self._boundaries,
        }
        if self._window is not None:
            sections["run"]["window"] = self._window.describe()
        session = Session(
            status=status,  # type: ignore[arg-type]
            error=error,
            environment=describe_environment(self.run),
            config=asdict(self.config),
            steps=self._steps.records(),
            sections=sections,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            ampdiag_version=__version__,
        )
        return session

    def _write_outputs(self) -> None:
        from ampdiag.analysis import analyze
        from ampdiag.render import render_all

        assert self.session is not None
        try:
            self.session.findings = analyze(self.session)
        except Exception as exc:
            self._warn(f"analysis failed: {exc!r}")
        try:
            self.session.save(self.out)
        except OSError as exc:
            print(f"ampdiag: could not save the session to {self.out}: {exc}", file=sys.stderr)
            return
        render_all(self.session, self.out, self.config)


def _describe_model(
    model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]
) -> dict[str, Any]:
    """The model as the optimizer sees it: ``parameters`` it updates, ``frozen`` copies apart."""
    params = list(model.parameters())
    updated, frozen = split_parameters(model, optimizers)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    out: dict[str, Any] = {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in updated),
        "param_dtypes": dtypes,
        "devices": sorted({str(p.device) for p in params}),
    }
    if frozen:
        out["frozen_parameters"] = sum(p.numel() for p in frozen)
        out["frozen_in"] = frozen_holders(model, frozen)
    policies = fsdp_mixed_precision(model)
    if policies:
        out["fsdp_mixed_precision"] = policies
    return out


def _describe_scaler(scaler: Any) -> dict[str, Any] | None:
    if scaler is None:
        return None
    return {
        "class": type(scaler).__name__,
        "enabled": compat_scaler.is_enabled(scaler),
        "device": compat_scaler.device(scaler),
    }


def diagnose(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any = None,
    *,
    out: str | Path | None = None,
    config: DiagnoseConfig | None = None,
    collectors: list[Collector] | None = None,
    **overrides: Unpack[Settings],
) -> Diagnosis | WindowedDiagnosis:
    """Watches the training in a ``with`` block and writes a diagnosis report.

    Args:
        model: The model; found by itself (global module hooks) when omitted.
        optimizer: The optimizer; found at its first step when omitted.
        scaler: The GradScaler; found at its first ``scale()`` when omitted.
        out: The output folder (default: a new ``reports/run-<time>/``). It is created and
            checked before the block runs.
        config: The settings (default: ``DiagnoseConfig()``); not modified.
        collectors: Replace the default collectors (advanced).
        **overrides: Any field of `DiagnoseConfig`, applied over ``config``, e.g.
            ``profile_active=5``, ``sample_every=10``, ``report=False`` (typed: mypy checks
            names and types); ``steps=(5000, 5020)`` or ``range(5000, 5020)`` diagnoses
            only those steps of a long loop, ``trigger="loss-spike"`` the steps after the
            loss first jumps.

    Returns:
        A `Diagnosis` handle (a `WindowedDiagnosis` for ``steps`` or ``trigger``):
        ``d.step()`` marks a step by hand; after the block ``d.session`` holds the Session
        and ``d.out`` the folder with session.json, report.html, tensorboard/ and trace/.

    Raises:
        TypeError: An unknown setting.
        ValueError: ``steps`` is not a window of steps, or ``trigger`` is unknown.
        OutputError: ``out`` cannot be written (raised on entering the block).

    Example:
        >>> with ampdiag.diagnose(out="reports/my-run") as d:  # doctest: +SKIP
        ...     for x, y in loader:
        ...         train_step(x, y)
    """
    settings = make_config(config, overrides)
    root = Path(out) if out is not None else default_out()
    if settings.steps is None and settings.trigger is None:
        return Diagnosis(model, optimizer, scaler, root, settings, collectors)
    driver = partial(WindowDriver, Diagnosis, root, settings, collectors, finish_on_close=False)
    return WindowedDiagnosis(driver, rank_folder(root), settings, (model, optimizer, scaler))


def make_config(config: DiagnoseConfig | None, overrides: Mapping[str, Any]) -> DiagnoseConfig:
    """``config`` (default: `DiagnoseConfig()`) with ``overrides`` on top, checked.

    What ``diagnose()`` and the framework callbacks (`ampdiag.integrations`) accept alike.

    Raises:
        TypeError: An unknown setting, or ``config`` is not a `DiagnoseConfig`.
        ValueError: ``steps`` is not a window of steps, or ``trigger`` is unknown.
    """
    overrides = dict(overrides)
    names = {f.name for f in fields(DiagnoseConfig)}
    if "steps" in overrides:  # a range is the same window as its (start, stop)
        overrides["steps"] = window_steps(overrides["steps"])
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"diagnose() got unknown settings {unknown}; known: {sorted(names)}")
    if config is not None and not isinstance(config, DiagnoseConfig):
        kind = type(config).__name__
        raise TypeError(f"diagnose(config=...) takes a DiagnoseConfig, not {kind}")
    settings = replace(config or DiagnoseConfig(), **overrides)
    settings.steps = window_steps(settings.steps)
    if settings.trigger is not None and settings.trigger not in TRIGGERS:
        raise ValueError(f"trigger={settings.trigger!r}: the known triggers are {TRIGGERS}")
    return settings
