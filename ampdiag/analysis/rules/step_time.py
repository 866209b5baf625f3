"""Findings from the host step-time breakdown of the profiled steps."""

from __future__ import annotations

from collections.abc import Iterator

from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session, Severity

THRESHOLDS = {
    # Share of the profiled step time spent in the DataLoader's __next__.
    "dataloader_share_medium": 0.10,
    "dataloader_share_high": 0.30,
}


@rule("dataloader-bound")
def dataloader_bound(session: Session) -> Iterator[Finding]:
    """Data loading takes >= 10% of the step (medium), >= 30% (high).

    The share comes from the profiler section's host breakdown of the profiled steps; where a
    ``timeline`` section (a trace of one or more ranks) gives each rank's share of step time in
    ``enumerate(DataLoader)`` annotations, the worst rank counts when it is larger.
    """
    bd = session.section("profiler").get("breakdown", {})
    data = float(bd.get("share", {}).get("data", 0.0))
    mean = bd.get("mean", {})
    data_us, step_us = float(mean.get("data_us", 0.0)), float(mean.get("total_us", 0.0))
    rank = None
    for r in session.section("timeline").get("ranks", []):
        share = float(r.get("data_share", 0.0)) if isinstance(r, dict) else 0.0
        if share > data:
            host_mean = r.get("host", {}).get("mean", {})
            data, rank = share, r.get("rank")
            data_us = float(host_mean.get("data_us", 0.0))
            step_us = float(host_mean.get("total_us", 0.0))
    if data < THRESHOLDS["dataloader_share_medium"]:
        return
    severity: Severity = "high" if data >= THRESHOLDS["dataloader_share_high"] else "medium"
    evidence = {
        "data_share": round(data, 4),
        "data_ms_per_step": round(data_us / 1000, 3),
        "step_ms": round(step_us / 1000, 3),
        "threshold": THRESHOLDS["dataloader_share_medium"],
    }
    if rank is not None:
        evidence["rank"] = rank
    yield Finding(
        id="dataloader-bound",
        severity=severity,
        title=f"Data loading takes {data:.0%} of each step: the model waits for its input.",
        evidence=evidence,
        fix=(
            "Load batches in worker processes and overlap the copy to the device:\n"
            "loader = DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True,\n"
            "                    persistent_workers=True, prefetch_factor=2)"
        ),
        section="time",
        impact=data,
    )


@rule("profiler-no-steps")
def profiler_no_steps(session: Session) -> Iterator[Finding]:
    """The profiler recorded no step (the block ran fewer steps than skip + warm-up + 1)."""
    prof = session.sections.get("profiler")
    if not isinstance(prof, dict):
        return
    # A trace is written at exit even when the block ended in the warm-up: what counts is
    # whether a step was recorded (older sessions have no recorded_steps: their trace says).
    if prof.get("recorded_steps") or ("recorded_steps" not in prof and prof.get("trace_files")):
        return
    sched = prof.get("schedule", {})
    need = int(sched.get("skip", 0)) + int(sched.get("warmup", 0)) + 1
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
