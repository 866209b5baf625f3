"""Before/after: what changed between two sessions of the same training code.

A fix is proven by running again and comparing. `diff_sessions` puts the figures a user checks
after a fix side by side (`METRICS`, each read from one session's headline figures, so a
diff's numbers are the two sessions' own; ``None`` where one lacks it) and sorts the findings
into resolved, new and unchanged by their stable ids over `Session.all_findings`, so a
symptom a fix removed shows as resolved even when a recommendation had explained it.
Pure: no torch, no rendering.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ampdiag.analysis.derive import derived
from ampdiag.session import SEVERITIES, Finding, Session, load
from ampdiag.units import number

Unit = Literal["s", "per_s", "bytes", "fraction", "count", "value"]
#: Which way a figure improves: "none" for a figure that is a description, not a goal (the
#: share of op time in low precision drops when low precision gets faster).
Direction = Literal["lower", "higher", "none"]
Verdict = Literal["better", "worse", "same", "changed", "not measured"]


def _scalar(key: str, field: str | None = None) -> Callable[[Session], float | None]:
    """A reader of a headline figure (`ampdiag.analysis.figures` defines each) or its ``field``."""

    def read(session: Session) -> float | None:
        value = derived(session).get("figures", {}).get(key)
        if field is not None:
            value = value.get(field) if isinstance(value, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    return read


step_time_s, step_time_spread_s = _scalar("step_time", "median_s"), _scalar("step_time", "spread_s")


def throughput(session: Session) -> float | None:
    """Steps per second: the inverse of the median step time."""
    step = step_time_s(session)
    return 1.0 / step if step else None


def throughput_spread(session: Session) -> float | None:
    """The step-time spread carried to steps per second (spread / median², to first order)."""
    step, spread = step_time_s(session), step_time_spread_s(session)
    return spread / step**2 if step and spread is not None else None


@dataclass(frozen=True)
class Metric:
    """One figure a diff compares: how to read it from a session, and which way is better."""

    key: str
    label: str
    unit: Unit
    better: Direction
    read: Callable[[Session], float | None]
    spread: Callable[[Session], float | None] | None = None


METRICS: tuple[Metric, ...] = (
    Metric("step_time_s", "Step time (median)", "s", "lower", step_time_s, step_time_spread_s),
    Metric("throughput", "Steps per second", "per_s", "higher", throughput, throughput_spread),
    Metric("memory_peak_bytes", "Memory peak", "bytes", "lower", _scalar("memory_peak_bytes")),
    Metric("underflow_fraction", "Gradient underflow (FP16 runs)", "fraction", "lower",
           _scalar("underflow_fraction")),
    Metric("skipped_steps", "Steps skipped by the GradScaler", "count", "lower",
           _scalar("skipped_steps", "skipped")),
    Metric("low_precision_flops_share", "FLOPs in low precision", "fraction", "higher",
           _scalar("low_precision_flops_share")),
    Metric("low_precision_time_share", "Op time in low precision", "fraction", "none",
           _scalar("low_precision_time_share")),
    Metric("final_loss", "Final loss", "value", "lower", _scalar("final_loss")),
)  # fmt: skip


@dataclass(frozen=True)
class MetricChange:
    """One figure in both sessions (``None``: that session did not measure it)."""

    key: str
    label: str
    unit: Unit
    better: Direction
    before: float | None
    after: float | None
    spread: float = 0.0

    @property
    def change(self) -> float | None:
        """After - before, where both were measured."""
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def verdict(self) -> Verdict:
        """Whether B improved on A for this figure, judged by the figure's direction.

        "same" when the two differ by at most 1%, or, for a timing, by no more than twice the
        larger run's spread (median absolute deviation of its steps): a timing difference
        inside the noise of the runs is not a change. A figure with no direction ("none")
        that moved is "changed": neither better nor worse.
        """
        if self.before is None or self.after is None:
            return "not measured"
        before_nan, after_nan = math.isnan(self.before), math.isnan(self.after)
        if before_nan or after_nan:  # a run that diverged (NaN loss) is the worse one
            if before_nan and after_nan:
                return "same"
            return "changed" if self.better == "none" else ("worse" if after_nan else "better")
        scale = max(abs(self.before), abs(self.after))
        if scale == 0 or abs(self.after - self.before) <= max(0.01 * scale, 2 * self.spread):
            return "same"
        if self.better == "none":
            return "changed"
        lower = self.after < self.before
        return "better" if lower == (self.better == "lower") else "worse"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "better": self.better,
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "spread": self.spread,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class SessionDiff:
    """Two sessions compared: figures side by side and findings sorted by what happened."""

    before_label: str
    after_label: str
    metrics: list[MetricChange]
    resolved: list[Finding] = field(default_factory=list)
    new: list[Finding] = field(default_factory=list)
    unchanged: list[Finding] = field(default_factory=list)
    #: Per-step curves of both runs, by name ("step_time_ms", "loss"): (before, after), each a
    #: list of (step, value) -- the diff page's charts.
    curves: dict[str, tuple[list[tuple[int, float]], list[tuple[int, float]]]] = field(
        default_factory=dict
    )
    #: The two sessions' folders (their report.html is there), where they have one.
    folders: tuple[str | None, str | None] = (None, None)

    def metric(self, key: str) -> MetricChange:
        """The change of one figure, by its key (see `METRICS`)."""
        for m in self.metrics:
            if m.key == key:
                return m
        raise KeyError(key)

    def __repr__(self) -> str:
        """A short form; the console and notebook forms are ``ampdiag.render.diff``'s."""
        return (
            f"SessionDiff(metrics={[m.key for m in self.metrics]}, "
            f"resolved={[f.id for f in self.resolved]}, new={[f.id for f in self.new]})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what ``ampdiag diff --format json`` prints)."""

        def brief(f: Finding) -> dict[str, Any]:
            return {"id": f.id, "severity": f.severity, "title": f.title}

        return {
            "before": self.before_label,
            "after": self.after_label,
            "folders": {"before": self.folders[0], "after": self.folders[1]},
            "metrics": [m.to_dict() for m in self.metrics],
            "findings": {
                "resolved": [brief(f) for f in self.resolved],
                "new": [brief(f) for f in self.new],
                "unchanged": [brief(f) for f in self.unchanged],
            },
        }


def _by_id(session: Session) -> dict[str, Finding]:
    """Each finding id once, at its worst severity (a recommendation and what it merged)."""
    out: dict[str, Finding] = {}
    for f in session.all_findings():
        known = out.get(f.id)
        if known is None or SEVERITIES.index(f.severity) < SEVERITIES.index(known.severity):
            out[f.id] = f
    return out


def _change(metric: Metric, before: Session, after: Session) -> MetricChange:
    spreads = [metric.spread(s) for s in (before, after)] if metric.spread else []
    return MetricChange(
        metric.key,
        metric.label,
        metric.unit,
        metric.better,
        metric.read(before),
        metric.read(after),
        spread=max((x for x in spreads if x is not None), default=0.0),
    )


def diff_sessions(
    before: Session, after: Session, labels: tuple[str, str] = ("before", "after")
) -> SessionDiff:
    """Compares two sessions: A (before a change) and B (after it)."""
    a, b = _by_id(before), _by_id(after)
    return SessionDiff(
        before_label=labels[0],
        after_label=labels[1],
        metrics=[_change(m, before, after) for m in METRICS],
        resolved=[f for i, f in a.items() if i not in b],
        new=[f for i, f in b.items() if i not in a],
        unchanged=[b[i] for i in a if i in b],
        curves={
            name: (read(before), read(after))
            for name, read in (("step_time_ms", _step_ms), ("loss", _losses))
        },
        folders=(_folder(before), _folder(after)),
    )


def _step_ms(session: Session) -> list[tuple[int, float]]:
    return [
        (int(s["index"]), float(s["wall_s"]) * 1000)
        for s in session.steps
        if isinstance(s.get("index"), int) and number(s.get("wall_s"), finite=True) is not None
    ]


def _losses(session: Session) -> list[tuple[int, float]]:
    return [
        (int(s["index"]), float(s["loss"]))  # type: ignore[arg-type]
        for s in session.steps
        if isinstance(s.get("index"), int) and number(s.get("loss"), finite=True) is not None
    ]


def _folder(session: Session) -> str | None:
    return str(session.path) if session.path is not None else None


def diff(
    before: Session | str | os.PathLike[str], after: Session | str | os.PathLike[str]
) -> SessionDiff:
    """Compares two runs: sessions, or folders holding a saved session.

    Example:
        >>> d = ampdiag.diff("reports/fp16-no-scaler", "reports/fp16-scaler")  # doctest: +SKIP
        >>> d.metric("underflow_fraction").verdict  # doctest: +SKIP
        'better'
    """
    a, b = (s if isinstance(s, Session) else load(s) for s in (before, after))
    return diff_sessions(a, b, labels=labels_for(a, b))


def labels_for(a: Session, b: Session) -> tuple[str, str]:
    """Names for the two runs: their folders' names where they differ, else "before"/"after"."""
    names = [s.path.name if s.path is not None else "" for s in (a, b)]
    if names[0] and names[1] and names[0] != names[1]:
        return names[0], names[1]
    return "before", "after"
