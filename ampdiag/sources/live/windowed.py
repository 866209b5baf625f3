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
from typing import Any

from ampdiag.config import DiagnoseConfig
from ampdiag.sources.live.step_watch import StepWatch
from ampdiag.sources.live.window import Block, WindowDriver


class Windowed:
    """The window of one ``diagnose()`` block (the `Diagnosis` handle delegates to it).

    Args:
        make: Makes the window's block (`Diagnosis`).
        out: The output folder.
        config: The settings (``steps`` or ``trigger`` set).
        collectors: The collectors the window's block attaches (None: the default ones).
        given: The model, optimizer and scaler given to ``diagnose()``.
    """

    def __init__(
        self,
        make: Callable[..., Block],
        out: Path,
        config: DiagnoseConfig,
        collectors: list[Any] | None,
        given: tuple[Any, Any, Any],
    ) -> None:
        self._given = given
        self.driver = WindowDriver(make, out, config, collectors, finish_on_close=False)
        self._watch: StepWatch | None = None

    def enter(self) -> None:
        """Starts counting steps (and opens the window at once when it begins at step 0)."""
        self.driver.start(0, *self._given)
        self._watch = StepWatch(
            self._boundary, losses=self.driver.window.watches_losses, scaler=self._given[2]
        )
        self._open_if_due(0)

    def step(self) -> None:
        """A step boundary marked by hand (``d.step()``)."""
        watch, driver = self._watch, self.driver
        if watch is not None:
            watch.mark()  # from now on only the marked boundaries count
        driver.mark_step()

    def _open_if_due(self, step: int) -> None:
        self.driver.step_begin(step, *self._given)
        if self.driver.diagnosis is not None and self._watch is not None:
            self._watch.paused = True  # the window's block counts its own steps

    def _boundary(self, step: int) -> None:
        if self.driver.diagnosis is not None:
            return  # opened already: one window per block
        watch = self._watch
        self.driver.step_end(step, watch.ready_losses() if watch is not None else [])
        self._open_if_due(step + 1)

    def exit(self, exc: BaseException | None) -> Block:
        """The block ended (``exc``: how): removes the watch, writes the window's session."""
        watch, self._watch = self._watch, None
        try:
            if watch is not None:
                watch.close()
        finally:
            block = self.driver.end(exc)
        return block
