"""``diagnose(steps=(A, B))`` and ``diagnose(trigger="loss-spike")``: a window of a long run.

The block runs the whole loop but diagnoses only the window's steps (`window.StepWindow`).
Until the window opens a `StepWatch` counts the step boundaries (and, for the trigger, reads
each step's loss); at the boundary before the window's first step a full `Diagnosis` opens,
with every collector, numbering its steps from there; at its own boundary after the window's
last step it stops observing (every hook removed) and the loop goes on at the watch's cost
until the block exits. That boundary is inside the user's ``optimizer.step()`` (or
``scaler.update()``), no place for the work that runs once the hooks are gone (the speed
probe's forwards, the trace, the report): that is done as the block exits, as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ampdiag._layout import REPORT_FILE
from ampdiag.config import DiagnoseConfig
from ampdiag.session import Session
from ampdiag.sources.live.collectors import RunContext
from ampdiag.sources.live.step_watch import StepWatch
from ampdiag.sources.live.window import WindowDriver


class WindowedDiagnosis:
    """The handle ``diagnose()`` yields for a window (``steps`` or ``trigger`` set).

    It only counts steps; the `Diagnosis` that observes the window's steps is a block of its
    own, opened and closed by a `WindowDriver`.

    Args:
        driver: Makes the `WindowDriver` (it checks the output folder: made on entering).
        out: The output folder (the rank's, in a distributed run).
        config: The settings (``steps`` or ``trigger`` set).
        given: The model, optimizer and scaler given to ``diagnose()``.

    Attributes:
        session: The window's Session, set on exit.
        run: The window's block's `RunContext`, set on exit.
    """

    def __init__(
        self,
        driver: Callable[[], WindowDriver],
        out: Path,
        config: DiagnoseConfig,
        given: tuple[Any, Any, Any],
    ) -> None:
        self._make_driver = driver
        self.out = out
        self.config = config
        self.session: Session | None = None
        self.run = RunContext(out=self.out, config=config)
        self._given = given
        self._driver: WindowDriver | None = None
        self._watch: StepWatch | None = None

    @property
    def report_path(self) -> Path:
        """Where report.html is (or will be) written."""
        return self.out / REPORT_FILE

    def __enter__(self) -> WindowedDiagnosis:
        """Starts counting steps (and opens the window at once when it begins at step 0)."""
        driver = self._make_driver()
        self._driver = driver
        driver.start(0, *self._given)
        self._watch = StepWatch(
            self._boundary, losses=driver.window.watches_losses, scaler=self._given[2]
        )
        self._open_if_due(0)
        return self

    def step(self) -> None:
        """Marks a step boundary by hand (for loops with no optimizer, or several per step)."""
        if self._watch is not None:
            self._watch.mark()  # from now on only the marked boundaries count
        if self._driver is not None:
            self._driver.mark_step()

    def _open_if_due(self, step: int) -> None:
        assert self._driver is not None
        self._driver.step_begin(step, *self._given)
        if self._driver.diagnosis is not None and self._watch is not None:
            self._watch.paused = True  # the window's block counts its own steps

    def _boundary(self, step: int) -> None:
        driver, watch = self._driver, self._watch
        if driver is None or driver.diagnosis is not None:
            return  # opened already: one window per block
        driver.step_end(step, watch.ready_losses() if watch is not None else [])
        self._open_if_due(step + 1)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Removes the watch and writes the window's session (the user's exception goes on)."""
        watch, self._watch = self._watch, None
        driver, self._driver = self._driver, None
        try:
            if watch is not None:
                watch.close()
        finally:
            if driver is not None:
                block = driver.end(exc)
                self.session, self.run = block.session, block.run
