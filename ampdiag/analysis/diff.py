"""Before/after: what changed between two sessions of the same training code.

A fix is proven by running again and comparing. `diff_sessions` puts the figures a user checks
after a fix side by side — step time, memory peak, gradient underflow, skipped steps, the
share of work that ran in low precision, the final loss — and sorts the findings into
resolved (in A, not in B), new (in B, not in A) and unchanged (in both).

Every figure is read by one small function of a single session (`METRICS`), so a diff's
numbers are exactly the two sessions' own numbers; a figure one session lacks is ``None``
("not measured"), never zero. Findings are compared by their stable ids over
`Session.all_findings` (recommendations and the findings they merged), so a symptom that a
fix removed shows as resolved even when another recommendation had explained it.

Pure: no torch, no rendering (``ampdiag diff`` is a report path).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ampdiag.analysis.precision import summarize
from ampdiag.session import SEVERITIES, Finding, Session, load

Unit = Literal["s", "bytes", "fraction", "count", "value"]


def _step_times(session: Session) -> list[float]:
    """Steps' wall times, leaving out step 0 (lazy initialization) when 3 or more ran."""
    times = [
        float(s["wall_s"])
        for s in session.steps
        if isinstance(s.get("wall_s"), (int, float)) and not isinstance(s.get("wall_s"), bool)
    ]
    return times[1:] if len(times) >= 3 else times


def step_time_s(session: Session) -> float | None:
    """Median wall time of a step (step 0 left out when 3 or more ran)."""
    times = _step_times(session)
    return statistics.median(times) if times else None


def step_time_spread_s(session: Session) -> float | None:
    """How much step times vary: their median absolute deviation from the median."""
    times = _step_times(session)
    if len(times) < 2:
        return None
    mid = statistics.median(times)
    return statistics.median(abs(t - mid) for t in times)


def final_loss(session: Session) -> float | None:
    """The last step's loss, where the run recorded one (may be NaN for a diverged run)."""
    for step in reversed(session.steps):
        loss = step.get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            return float(loss)
        if loss in ("nan", "inf", "-inf"):
            return float(loss)
    return None


def memory_peak_bytes(session: Session) -> float | None:
    """The memory peak over the profiled steps (the memory section's ``peak.bytes``)."""
    peak = session.section("memory").get("peak")
    value = peak.get("bytes") if isinstance(peak, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def underflow_fraction(session: Session) -> float | None:
    """The share of gradient values lost to FP16's range: flushed to zero or subnormal.

    Reads the gradients section's totals: ``underflow_fraction`` where the session has it,
    else the flushed plus subnormal fractions it is made of. Only for runs that computed in
    FP16: for a BF16 or FP32 run those totals are a what-if, not something the run lost.
    """
    if not str(session.environment.get("autocast") or "").endswith(":float16"):
        return None
    totals = session.section("gradients").get("totals")
    if not isinstance(totals, dict):
        return None
    direct = totals.get("underflow_fraction")
    if isinstance(direct, (int, float)):
        return float(direct)
    parts = [totals.get("flush_fraction"), totals.get("subnormal_fraction")]
    if not all(isinstance(p, (int, float)) for p in parts):
        return None
    return float(sum(parts))  # type: ignore[arg-type]


def skipped_steps(session: Session) -> float | None:
    """Steps the GradScaler skipped (inf/NaN gradients); ``None`` when no scaler was seen."""
    scaler = session.section("scaler")
    if not scaler.get("present"):
        return None
    total = scaler.get("skipped_total")  # over every step; the list is capped on long runs
    if isinstance(total, int):
        return float(total)
    skipped = scaler.get("skipped_steps")
    return float(len(skipped)) if isinstance(skipped, list) else None


def _low_precision_share(session: Session, measure: str) -> float | None:
    """The low-precision share of the audited step's ``measure`` ("flops" or "time_us")."""
    section = session.section("precision")
    if not section.get("audited"):
        return None
    totals = summarize(section)[measure]
    work = totals["low"] + totals["fp32"]
    return totals["low"] / work if work > 0 else None


def low_precision_flops_share(session: Session) -> float | None:
    """The share of the audited step's FLOPs that ran in a low-precision dtype."""
    return _low_precision_share(session, "flops")


def low_precision_time_share(session: Session) -> float | None:
    """The share of the audited step's op time (casts excluded) spent in low precision."""
    return _low_precision_share(session, "time_us")


@dataclass(frozen=True)
class Metric:
    """One figure a diff compares: how to read it from a session, and which way is better."""

    key: str
    label: str
    unit: Unit
    better: Literal["lower", "higher"]
    read: Callable[[Session], float | None]
    spread: Callable[[Session], float | None] | None = None


METRICS: tuple[Metric, ...] = (
    Metric("step_time_s", "Step time (median)", "s", "lower", step_time_s, step_time_spread_s),
    Metric("memory_peak_bytes", "Memory peak", "bytes", "lower", memory_peak_bytes),
    Metric("underflow_fraction", "Gradient underflow (FP16 runs)", "fraction", "lower",
           underflow_fraction),
    Metric("skipped_steps", "Steps skipped by the GradScaler", "count", "lower", skipped_steps),
    Metric("low_precision_flops_share", "FLOPs in low precision", "fraction", "higher",
           low_precision_flops_share),
    Metric("low_precision_time_share", "Op time in low precision", "fraction", "higher",
           low_precision_time_share),
    Metric("final_loss", "Final loss", "value", "lower", final_loss),
)  # fmt: skip


@dataclass(frozen=True)
class MetricChange:
    """One figure in both sessions (``None``: that session did not measure it)."""

    key: str
    label: str
    unit: Unit
    better: Literal["lower", "higher"]
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
    def verdict(self) -> Literal["better", "worse", "same", "not measured"]:
        """Whether B improved on A for this figure.

        "same" when the two differ by at most 1%, or, for a timing, by no more than twice the
        larger run's spread (median absolute deviation of its steps): a timing difference
        inside the noise of the runs is not a change.
        """
        if self.before is None or self.after is None:
            return "not measured"
        before_nan, after_nan = math.isnan(self.before), math.isnan(self.after)
        if before_nan or after_nan:  # a run that diverged (NaN loss) is the worse one
            return "same" if before_nan and after_nan else ("worse" if after_nan else "better")
        scale = max(abs(self.before), abs(self.after))
        if scale == 0 or abs(self.after - self.before) <= max(0.01 * scale, 2 * self.spread):
            return "same"
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
    )


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
