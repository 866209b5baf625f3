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
    """Data loading takes >= 10% of the step (medium), >= 30% (high)."""
    share = session.section("profiler").get("breakdown", {}).get("share", {})
    data = float(share.get("data", 0.0))
    if data < THRESHOLDS["dataloader_share_medium"]:
        return
    mean = session.section("profiler")["breakdown"]["mean"]
    severity: Severity = "high" if data >= THRESHOLDS["dataloader_share_high"] else "medium"
    yield Finding(
        id="dataloader-bound",
        severity=severity,
        title=f"Data loading takes {data:.0%} of each step: the model waits for its input.",
        evidence={
            "data_share": round(data, 4),
            "data_ms_per_step": round(mean["data_us"] / 1000, 3),
            "step_ms": round(mean["total_us"] / 1000, 3),
            "threshold": THRESHOLDS["dataloader_share_medium"],
        },
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
    if not isinstance(prof, dict) or prof.get("trace_files"):
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
