"""Whether the session measured anything at all: silence is a verdict only over measurements.

Every other rule stays quiet when its section is missing, so a session that recorded nothing
(a block that trained no step, a hand-written or truncated ``session.json``) would otherwise
read as healthy and pass a ``--fail-on`` gate. This rule turns "nothing was measured" into a
high finding, so that the verdict says so and every gate fails on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session

NOT_MEASUREMENTS = frozenset({"derived", "run"})
"""Sections that describe the run (settings, what was found, warnings) or are derived by
analysis: they hold no measurement of their own."""

TRACE_SOURCES = frozenset({"trace", "ranks"})


def measured_sections(session: Session) -> list[str]:
    """The sections that hold something (a non-empty object or list), measurements only."""
    return sorted(
        name
        for name, value in session.sections.items()
        if name not in NOT_MEASUREMENTS and isinstance(value, (dict, list)) and value
    )


def _live(session: Session) -> bool:
    """A session a live ``diagnose()`` block wrote (traces and snapshots name their source)."""
    return "source" not in session.environment and bool(session.sections.get("run"))


def _count(run: dict[str, Any], key: str) -> int:
    value = run.get(key)
    return len(value) if isinstance(value, (list, dict)) else 0


@rule("nothing-measured")
def nothing_measured(session: Session) -> Iterator[Finding]:
    """A live run that recorded no training step, or a session with no measured section.

    High, so that the verdict names it and ``--fail-on`` at any severity fails: a report of
    nothing must not pass as a healthy run. A trace or a snapshot is measured by its own
    sections (the timeline, the memory), not by steps.
    """
    if session.steps:
        return
    measured = measured_sections(session)
    if _live(session):
        run = session.sections.get("run")
        run = run if isinstance(run, dict) else {}
        window = run.get("window")
        if isinstance(window, dict) and window.get("opened_at") is None:
            yield _window_never_opened(window)
            return
        models, optimizers = _count(run, "models"), _count(run, "optimizers")
        backward = run.get("backward_calls")
        if not models and not backward:
            why = "no model ran a forward inside the block"
        elif isinstance(backward, int) and backward and not optimizers:
            why = f"{backward} backward passes, but no optimizer.step() and no d.step()"
        elif not optimizers:
            why = "no optimizer stepped and d.step() was never called"
        else:
            why = "no step ended inside the block"
        yield Finding(
            id="nothing-measured",
            severity="high",
            title=(
                f"No training step was recorded ({why}): nothing in this report describes training."
            ),
            evidence={
                "steps": 0,
                "models_seen": models,
                "optimizers_seen": optimizers,
                "block_s": run.get("duration_s"),
            },
            fix=(
                "Run the training loop inside the block; a loop without optimizer.step() "
                "(hand-written updates) marks each step itself:\n"
                "with ampdiag.diagnose() as d:\n"
                "    for batch in loader:\n"
                "        ...  # forward, backward, update\n"
                "        d.step()"
            ),
            impact=1.0,
        )
        return
    if session.environment.get("source") in TRACE_SOURCES or measured:
        return
    yield Finding(
        id="nothing-measured",
        severity="high",
        title="This session holds no measurement: no step and no measured section.",
        evidence={"steps": 0, "sections": sorted(session.sections)},
        fix=(
            "Open the session.json that diagnose() wrote for a run that trained (its folder "
            "holds report.html beside it), or a Kineto trace."
        ),
        impact=1.0,
    )


def _window_never_opened(window: dict[str, Any]) -> Finding:
    """A window of steps that never opened: a trigger that never fired is the healthy case.

    A loss-spike trigger that never fired is information (info: the loss stayed within its
    bound); a planned window the run never reached is nothing measured (high).
    """
    seen = window.get("last_step_seen")
    ran = f"{int(seen) + 1} steps ran" if isinstance(seen, int) else "no step was seen"
    if window.get("trigger") and not window.get("steps"):
        return Finding(
            id="nothing-measured",
            severity="info",
            title=(
                f"The {window['trigger']} trigger never fired ({ran}): the loss stayed within "
                "its bound, so no step was diagnosed."
            ),
            evidence={"steps": 0, "trigger": window["trigger"], "last_step_seen": seen},
            fix="",
            impact=0.0,
        )
    planned = window.get("planned") or window.get("steps") or [None, None]
    first, end = [*list(planned), None, None][:2]
    span = f"{first}:{end}" if end is not None else f"{first}:"
    return Finding(
        id="nothing-measured",
        severity="high",
        title=(
            f"The window of steps {span} never opened ({ran}): nothing in this report "
            "describes training."
        ),
        evidence={"steps": 0, "window": span, "last_step_seen": seen},
        fix=(
            "Name steps the run reaches: diagnose(steps=(A, B)) or ampdiag run --steps A:B "
            "with A below the run's last step (steps count from 0)."
        ),
        impact=1.0,
    )
