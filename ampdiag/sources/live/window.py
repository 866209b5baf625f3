"""Diagnosing a window of a long run: which steps, and the block opened and closed around them.

A long run (100 000 steps, a divergence at step 5 000) cannot be watched on every step at a
detailed collector's cost, and a report of its first steps says nothing about step 5 000. So a
window (``DiagnoseConfig.steps``, or ``trigger="loss-spike"``) names the steps to diagnose;
outside it only the step boundaries are counted. `StepWindow` decides, from step indices and
losses alone, when the window opens and closes; `WindowDriver` opens a `Diagnosis` (every
collector, the steps under their run-wide numbers) at the first step of the window and closes
it after the last one. Whoever counts the steps drives it: ``diagnose(steps=...)`` with its own
step watch (`sources/live/windowed.py`), or a framework's loop through its callbacks
(`ampdiag.integrations`), with the framework's own step counter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from ampdiag.config import DiagnoseConfig
from ampdiag.sources.live.loss_spike import Spike, SpikeDetector


class Block(Protocol):
    """What the driver opens and closes: a `Diagnosis` (passed in as ``make``: no import)."""

    session: Any
    run: Any

    def __enter__(self) -> Any: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def stop(self, raised: bool) -> None:
        """Removes every hook (the first half of the exit)."""

    def finish(self, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Writes the session and report (the second half)."""

    def step(self) -> None:
        """Marks a step boundary by hand."""


#: The end of a window that is the whole run (no step index reaches it).
WHOLE_RUN = 2**62


class StepWindow:
    """Which steps are diagnosed: ``config.steps``, or those after a loss spike (one window).

    Args:
        config: ``steps``, ``trigger`` and ``trigger_steps`` are read; neither ``steps`` nor
            ``trigger`` (a framework callback given no window): every step from the first.
    """

    def __init__(self, config: DiagnoseConfig) -> None:
        self.steps = config.steps
        self.trigger = config.trigger
        self.trigger_steps = max(1, config.trigger_steps)
        self._detector = SpikeDetector() if config.trigger == "loss-spike" else None
        self.spike: Spike | None = None
        self._first: int | None = None
        self._end: int | None = None
        if self._detector is None:
            self._first, self._end = self.steps or (0, WHOLE_RUN)
        self.opened_at: int | None = None
        self.closed_after: int | None = None
        self.last_step: int | None = None  # the last step seen ending

    @property
    def watches_losses(self) -> bool:
        """Whether the step losses are still needed (a trigger that has not fired)."""
        return self._detector is not None and self.spike is None

    def saw_loss(self, step: int, loss: float) -> None:
        """Step ``step``'s loss (read maybe a step or two later): the trigger may fire."""
        if self._detector is None or self.spike is not None:
            return
        spike = self._detector.add(step, loss)
        if spike is None:
            return
        if self.steps is not None and not self.steps[0] <= step < self.steps[1]:
            return  # outside the steps the trigger may open in
        self.spike = spike
        self._first, self._end = step + 1, step + 1 + self.trigger_steps

    def opens(self, step: int) -> bool:
        """Whether the window opens as step ``step`` begins."""
        if self.opened_at is not None or self._first is None or self._end is None:
            return False
        if self.spike is not None:
            return step >= self._first  # a loss read late: the window starts late, whole
        return self._first <= step < self._end

    def open_at(self, step: int) -> None:
        """The window opened as step ``step`` began."""
        self.opened_at = step
        if self.spike is not None:
            self._first, self._end = step, step + self.trigger_steps

    def closes_after(self, step: int) -> bool:
        """Whether the window closes as step ``step`` ends."""
        return self._end is not None and step + 1 >= self._end

    def describe(self) -> dict[str, Any]:
        """The window as the session's ``run`` section records it."""
        return {
            "steps": list(self.steps) if self.steps is not None else None,
            "trigger": self.trigger,
            "trigger_steps": self.trigger_steps if self.trigger else None,
            "planned": (
                [self._first, self._end if self._end != WHOLE_RUN else None]
                if self._first is not None
                else None
            ),
            "opened_at": self.opened_at,
            "closed_after": self.closed_after,
            "last_step_seen": self.last_step,
            "spike": self.spike.to_dict() if self.spike is not None else None,
        }


class WindowDriver:
    """Opens a `Diagnosis` when the window begins and closes it when it ends.

    The run-wide collectors (`Collector.run_wide`: the sentinel) are not the window's: they
    watch every step from `start` in a block of their own, so a first inf/NaN before the
    window (the very step a loss-spike trigger fires on) is found where it happened and
    replayed before its update; that block stops as the window's session is written, which
    holds their sections. A window that is the whole run (a callback given no window) keeps
    them in its own block.

    Args:
        make: Makes the window's block: `Diagnosis` (its constructor's arguments).
        out: The output folder (checked now: a bad folder fails before training starts).
        config: The settings (with ``steps`` or ``trigger``).
        collectors: Replace the default collectors (advanced).
        finish_on_close: True (a framework's callbacks): `step_end` closes the window and
            the session and report are written then, between two steps. False
            (``diagnose(steps=...)``): the block's own step boundary closes it, inside the
            optimizer step, where it only stops observing; `end` writes them.
    """

    def __init__(
        self,
        make: Callable[..., Block],
        out: Path,
        config: DiagnoseConfig,
        collectors: list[Any] | None = None,
        *,
        finish_on_close: bool = True,
    ) -> None:
        from ampdiag._layout import check_writable
        from ampdiag.sources.live.collectors import default_collectors

        check_writable(out)
        self._make = make
        self.out = out
        self.config = config
        self.window = StepWindow(config)
        chosen = collectors if collectors is not None else default_collectors(config)
        whole = config.steps is None and config.trigger is None
        self._run_wide = [] if whole else [c for c in chosen if getattr(c, "run_wide", False)]
        self._collectors = [c for c in chosen if all(c is not r for r in self._run_wide)]
        self._finish_on_close = finish_on_close
        self.diagnosis: Block | None = None
        self.run_wide: Block | None = None  # the run-wide collectors' block, while it runs
        self._run_wide_warnings: list[str] = []
        self._closing = False
        self._stopped = False  # the window's block stopped observing, not yet written

    @property
    def is_open(self) -> bool:
        """Whether the window's block observes now."""
        return self.diagnosis is not None and not self._stopped

    def start(
        self, step: int = 0, model: Any = None, optimizer: Any = None, scaler: Any = None
    ) -> None:
        """The run begins at step ``step``: the run-wide collectors start watching."""
        if not self._run_wide or self.run_wide is not None:
            return
        block = self._make(
            model,
            optimizer,
            scaler,
            self.out,
            self.config,
            self._run_wide,
            first_step=step,
            window=self.window,
        )
        try:
            block.__enter__()
        except Exception as exc:  # the run goes on: the window's block still diagnoses it
            self._run_wide_warnings.append(f"the run-wide watch could not start: {exc!r}")
            self._run_wide = []
            return
        self.run_wide = block

    def step_begin(
        self, step: int, model: Any = None, optimizer: Any = None, scaler: Any = None
    ) -> None:
        """Step ``step`` begins: opens the window's block there when it is the window's."""
        if self.diagnosis is not None or not self.window.opens(step):
            return
        self.window.open_at(step)
        d = self._make(
            model,
            optimizer,
            scaler,
            self.out,
            self.config,
            self._collectors,
            first_step=step,
            window=self.window,
            # Closed by its own step boundary only when nobody else marks the steps' ends.
            after_step=None if self._finish_on_close else self._block_step_ended,
            borrowed=self._run_wide,
        )
        d.__enter__()
        self.diagnosis = d

    def mark_step(self) -> None:
        """A step boundary marked by hand (``d.step()``), for every block observing now."""
        if self.run_wide is not None:
            self.run_wide.step()
        if self.is_open and self.diagnosis is not None:
            self.diagnosis.step()

    def _block_step_ended(self, step: int) -> None:
        """The open block ended a step (its own step boundary): the window may close."""
        self.window.last_step = step
        if not self._closing and self.window.closes_after(step):
            self.close()

    def step_end(self, step: int, losses: Sequence[tuple[int, float]] = ()) -> None:
        """Step ``step`` ended (as its counter sees it); ``losses``: (step, loss) read since."""
        self.window.last_step = step
        if self.is_open:
            if self.window.closes_after(step):
                self.close()
            return
        if self.diagnosis is None:
            for at, loss in losses:
                self.window.saw_loss(at, loss)

    def close(self, exc: BaseException | None = None) -> None:
        """Closes the window's block (``exc``: the user's exception that ended it)."""
        d = self.diagnosis
        if d is None or self._stopped or self._closing:
            return
        self._closing = True
        try:
            self.window.closed_after = self.window.last_step
            d.stop(raised=exc is not None)
            self._stopped = True
            if self._finish_on_close or exc is not None:
                self._finish(d, exc)
        finally:
            self._closing = False

    def _finish(self, d: Block, exc: BaseException | None) -> None:
        """Writes ``d``'s session, the run-wide block stopped first (its sections settled)."""
        block, self.run_wide = self.run_wide, None
        interrupt: BaseException | None = None
        if block is not None:
            try:
                block.stop(raised=exc is not None)
            except BaseException as stopped:  # a Ctrl-C deferred while it stopped
                interrupt = stopped
            self._run_wide_warnings += list(block.run.warnings)
        for message in self._run_wide_warnings:
            d.run.warn(message)
        d.finish(exc, exc.__traceback__ if exc is not None else None)
        if interrupt is not None:
            raise interrupt

    def end(self, exc: BaseException | None = None) -> Block:
        """The run ended (``exc``: how): writes what the window saw; returns the block.

        A window that never opened still gets a session (no steps, the window in its
        ``run`` section, a warning saying why, what the run-wide collectors saw), so a run
        always leaves a report.
        """
        d = self.diagnosis
        if d is not None and not self._stopped:
            self.close(exc)
        elif d is not None and d.session is None:
            self._finish(d, None)
        if d is None:
            d = self._make(
                None,
                None,
                None,
                self.out,
                self.config,
                [],
                window=self.window,
                borrowed=self._run_wide,
            )
            d.run.warn(self.never_opened())
            self._finish(d, exc)
            self.diagnosis = d
        return d

    def never_opened(self) -> str:
        """Why the window's block never opened, in words."""
        seen = self.window.last_step
        ran = "no step ended" if seen is None else f"the run ended after step {seen}"
        if self.window.trigger:
            return f"the trigger {self.window.trigger!r} never fired ({ran}): nothing diagnosed"
        first = self.window.steps[0] if self.window.steps else 0
        return f"the window's first step {first} was never reached ({ran}): nothing diagnosed"
