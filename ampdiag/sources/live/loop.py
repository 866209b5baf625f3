"""A framework's training loop driving a window of steps: the core of every integration.

A framework (Hugging Face Trainer, Lightning) has its own step counter and calls back at each
step's start and end, between two steps: the safe place to open a diagnosis (every collector
attached before the step's first forward) and to close it and write the session and report
(no optimizer step in progress). `LoopWindow` is what its callbacks call, framework-free; the
adapters in `ampdiag.integrations` only translate the framework's events into these calls,
with the framework's step index (``trainer.state.global_step``, ``trainer.global_step``: the
optimizer updates done so far, so the one about to run is that number).

Outside the window nothing of ampdiag's is installed, except for a trigger, which needs each
step's loss: a `StepWatch` then sums the losses passed to ``backward`` (one patch) until the
window opens.

A framework with no callback for an exception (the HF Trainer) cannot say that its run raised
inside the window: the next `begin` closes what was left open, and so does the interpreter's
exit (``atexit``), with the uncaught exception Python kept (``sys.last_value``), so a script
that dies inside the window still leaves its session and report.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path

from ampdiag.config import DiagnoseConfig
from ampdiag.session import Session
from ampdiag.sources.live.diagnosis import Diagnosis, default_out
from ampdiag.sources.live.step_watch import StepWatch
from ampdiag.sources.live.window import WindowDriver


class LoopWindow:
    """One training run's window, driven by a framework's callbacks.

    Args:
        config: The settings (``steps`` or ``trigger``; neither: every step from the start).
        out: The output folder (default: a new ``reports/run-<time>/``), checked at `begin`.
    """

    def __init__(self, config: DiagnoseConfig, out: str | Path | None = None) -> None:
        self.config = config
        self.out = Path(out) if out is not None else default_out()
        self._driver: WindowDriver | None = None
        self._watch: StepWatch | None = None
        self.session: Session | None = None

    @property
    def is_open(self) -> bool:
        """Whether the window's block observes now."""
        return self._driver is not None and self._driver.is_open

    def begin(self, step: int) -> None:
        """The run begins at step ``step`` (a resumed run: past 0)."""
        self.end()  # a previous run that ended without telling (an exception in the Trainer)
        self._driver = WindowDriver(Diagnosis, self.out, self.config)
        atexit.register(self._at_exit)
        self._driver.start(step)
        if self._driver.window.watches_losses:
            self._watch = StepWatch(_ignore, first_step=step, losses=True)

    def step_begin(self, step: int) -> None:
        """Step ``step`` begins: the window may open."""
        driver = self._driver
        if driver is None or driver.diagnosis is not None:
            return
        driver.step_begin(step)
        if driver.diagnosis is not None:
            self._drop_watch()  # the window's block reads the losses now

    def step_end(self, step: int) -> None:
        """Step ``step`` ended: the window may close (its session and report are written)."""
        driver = self._driver
        if driver is None:
            return
        driver.step_end(step, self._watch.ready_losses() if self._watch is not None else [])
        if driver.diagnosis is not None and not driver.is_open:
            self.session = driver.diagnosis.session

    def end(self, exc: BaseException | None = None) -> Session | None:
        """The run ended (``exc``: the exception that ended it): everything is removed."""
        driver, self._driver = self._driver, None
        self._drop_watch()
        if driver is not None:
            atexit.unregister(self._at_exit)
            self.session = driver.end(exc).session
        return self.session

    def _at_exit(self) -> None:
        """The interpreter exits with the run unfinished: what the window saw is written."""
        last = getattr(sys, "last_value", None)
        self.end(last if isinstance(last, BaseException) else None)

    def _drop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()


def _ignore(step: int) -> None:
    """The framework counts the steps: the watch's own boundaries are not needed."""
