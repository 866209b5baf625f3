"""Findings from the host step-time breakdown of the profiled steps."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ampdiag import timing
from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Share of the profiled step time spent in the DataLoader's __next__.
    dataloader_share_medium: float = 0.10
    dataloader_share_high: float = 0.30
    # A single profiled step (no interval) is worth an uncertain note only from this share:
    # one step of 0% says nothing a person could act on.
    dataloader_share_single_min: float = 0.05


THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class DataWait:
    """The data-loading share of the steps of one breakdown, with the per-step figures."""

    share: timing.Estimate
    data_ms: float
    step_ms: float
    rank: Any = None


def data_wait(breakdown: dict[str, Any], rank: Any = None) -> DataWait | None:
    """The median data share of a host breakdown's steps (`ampdiag.timing`), or None.

    Each step's share is its own data time over its own wall time, and the median over the
    steps is taken, never the mean: one step that stalled (a page fault, a garbage
    collection, another process) among three would drive a mean share past the threshold of
    a run that is not data bound at all. A breakdown without per-step rows (older sessions)
    gives its one mean share: a single sample, so at most an uncertain finding.
    """
    rows = [
        r
        for r in breakdown.get("steps", [])
        if isinstance(r, dict) and isinstance(r.get("total_us"), (int, float)) and r["total_us"] > 0
    ]
    if rows:
        shares = [float(r.get("data_us", 0.0)) / float(r["total_us"]) for r in rows]
        data_ms = statistics.median(float(r.get("data_us", 0.0)) for r in rows) / 1000
        step_ms = statistics.median(float(r["total_us"]) for r in rows) / 1000
        return DataWait(timing.estimate(shares), data_ms, step_ms, rank)
    share = breakdown.get("share", {}).get("data")
    if not isinstance(share, (int, float)):
        return None
    mean = breakdown.get("mean", {})
    return DataWait(
        timing.estimate([float(share)]),
        float(mean.get("data_us", 0.0)) / 1000,
        float(mean.get("total_us", 0.0)) / 1000,
        rank,
    )


@rule("dataloader-bound")
def dataloader_bound(session: Session) -> Iterator[Finding]:
    """Data loading takes >= 10% of the step (medium), >= 30% (high), in the median step.

    The share comes from the profiler section's host breakdown of the profiled steps; where a
    ``timeline`` section (a trace of one or more ranks) gives each rank's host breakdown, the
    worst rank counts when its median is larger. The thresholds are compared with the
    interval median ± spread of the per-step shares (`ampdiag.timing`), so a single stalled
    step neither fires the finding nor raises its severity (the severity is that of the
    interval's lower end). An interval that straddles 10% (or a single step of at least 5%) is
    reported as uncertain (info, with the interval) instead of flipping between runs; a single
    step below 5% is no finding (it would tell the user nothing), and neither are steps with no
    data-loading span at all (a share of 0).
    """
    waits = [data_wait(session.section("profiler").get("breakdown", {}))]
    for r in session.section("timeline").get("ranks", []):
        if isinstance(r, dict) and isinstance(r.get("host"), dict):
            waits.append(data_wait(r["host"], r.get("rank")))
    found = [w for w in waits if w is not None]
    if not found:
        return
    worst = max(found, key=lambda w: w.share.median)
    est = worst.share
    side = est.versus(THRESHOLDS.dataloader_share_medium)
    if side == "below":
        return
    if est.samples < timing.MIN_SAMPLES and est.median < THRESHOLDS.dataloader_share_single_min:
        return
    data = est.median
    if est.high <= 0.0:
        return  # no data-loading span in any step (a trace of a model fed otherwise): no claim
    evidence: dict[str, Any] = {
        "data_share": round(data, 4),
        "data_share_spread": round(est.spread, 4),
        "data_share_low": round(est.low, 4),
        "data_share_high": round(est.high, 4),
        "steps": est.samples,
        "data_ms_per_step": round(worst.data_ms, 3),
        "step_ms": round(worst.step_ms, 3),
        "threshold": THRESHOLDS.dataloader_share_medium,
    }
    if worst.rank is not None:
        evidence["rank"] = worst.rank
    if side == "uncertain":
        threshold = THRESHOLDS.dataloader_share_medium
        why = timing.why_uncertain(est, threshold, "profiled step", "{:.0%}")
        yield Finding(
            id="dataloader-bound",
            severity="info",
            title=(
                f"Data loading may take {data:.0%} of a step, but it could not be measured "
                f"reliably: {why}."
            ),
            evidence={**evidence, "uncertain": why},
            fix=(
                "# Profile more steps to tell:\nwith ampdiag.diagnose(profile_active=10) as d: ..."
            ),
            section="time",
            impact=0.0,
        )
        return
    high = est.low >= THRESHOLDS.dataloader_share_high
    severity: Severity = "high" if high else "medium"
    yield Finding(
        id="dataloader-bound",
        severity=severity,
        title=(
            f"Data loading takes {data:.0%} (± {est.spread:.0%}) of each step: the model waits "
            "for its input."
        ),
        evidence=evidence,
        fix=(
            "Load batches in worker processes and overlap the copy to the device:\n"
            "loader = DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True,\n"
            "                    persistent_workers=True, prefetch_factor=2)"
        ),
        section="time",
        impact=data,
    )


def _run_counts(session: Session) -> tuple[int, int, int] | None:
    """(backward calls, optimizer steps, step boundaries) of the block; None in older sessions."""
    run = session.sections.get("run")
    if not isinstance(run, dict) or "step_boundaries" not in run:
        return None
    return (
        int(run.get("backward_calls") or 0),
        int(run.get("optimizer_steps") or 0),
        int(run.get("step_boundaries") or 0),
    )


@rule("no-step-boundary")
def no_step_boundary(session: Session) -> Iterator[Finding]:
    """Backward passes ran but no step boundary came (no ``optimizer.step``, no ``d.step()``)."""
    counts = _run_counts(session)
    if counts is None:
        return
    backward, optimizer_steps, boundaries = counts
    if boundaries or not backward:
        return
    yield Finding(
        id="no-step-boundary",
        severity="low",
        title=(
            f"{backward} backward passes ran but no step boundary was seen: no optimizer.step() "
            "(parameters updated by hand?) and no d.step(), so the whole block counts as one "
            "step and nothing per-step (profiler, sampling, step times) could run."
        ),
        evidence={
            "backward_calls": backward,
            "optimizer_steps": optimizer_steps,
            "step_boundaries": 0,
        },
        fix=(
            "Mark each training step's end by hand:\n"
            "with ampdiag.diagnose() as d:\n"
            "    for x, y in loader:\n"
            "        train_step(x, y)  # updates the parameters itself\n"
            "        d.step()"
        ),
        section="time",
    )


@rule("profiler-no-steps")
def profiler_no_steps(session: Session) -> Iterator[Finding]:
    """The profiler recorded no step (the block ran fewer steps than skip + warm-up + 1).

    Not when the block trained nothing or saw no step boundary: ``nothing-measured``
    (rules/coverage.py) and `no_step_boundary` name those causes.
    """
    prof = session.sections.get("profiler")
    if not isinstance(prof, dict):
        return
    counts = _run_counts(session)
    if counts is not None and (not any(counts) or (counts[0] and not counts[2])):
        return
    # A trace is written at exit even when the block ended in the warm-up: what counts is
    # whether a step was recorded (older sessions have no recorded_steps: their trace says).
    if prof.get("recorded_steps") or ("recorded_steps" not in prof and prof.get("trace_files")):
        return
    sched = prof.get("schedule", {})
    need = int(sched.get("skip", 0)) + int(sched.get("warmup", 0)) + 1
    if int(prof.get("steps_seen", 0)) >= need:
        return  # long enough: the profiler stopped for another reason (its section says)
    yield Finding(
        id="profiler-no-steps",
        severity="info",
        title="No step was profiled: the run was shorter than the profiler's warm-up.",
        evidence={"steps_seen": prof.get("steps_seen", 0), "steps_needed": need},
        fix=(
            f"Run at least {need} steps inside diagnose(), or profile from the first step:\n"
            "with ampdiag.diagnose(profile_skip=0, profile_warmup=0) as d: ..."
        ),
        section="time",
    )
