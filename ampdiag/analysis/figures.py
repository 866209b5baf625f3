"""The headline figures of a run, each computed once: what every surface states about it.

The HTML report, the console, TensorBoard, the diff and the notebooks all state a run's step
time, final loss, memory peak, gradient underflow, skipped steps, loss scale and how fast its
precision runs against FP32. Each is computed here, once, and stored by the derive step as
``derived.figures``; a surface reads it there (`stored`) and only formats it, so two surfaces
cannot state two values of one quantity. A figure the session cannot give is ``None``
("not measured"), never zero. Pure and torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ampdiag import timing
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.derive import part
from ampdiag.schema import Figures, SpeedVsFp32, StepTime
from ampdiag.session import Session
from ampdiag.units import number


def step_walls_s(session: Session) -> list[float]:
    """The steps' wall times the step-time figure rests on: step 0 left out when 3 or more ran.

    The first step pays for lazy initialization (allocations, kernel selection, compilation).
    """
    times = [w for w in (number(s.get("wall_s")) for s in session.steps) if w is not None]
    return times[1:] if len(times) >= 3 else times


def step_time(session: Session) -> StepTime | None:
    """Median wall time of a step with its spread (MAD), over `step_walls_s`."""
    times = step_walls_s(session)
    if not times:
        return None
    est = timing.estimate(times)
    return {
        "median_s": est.median,
        "spread_s": est.spread if len(times) >= 2 else None,
        "steps": len(times),
        "first_left_out": len(times) < len([s for s in session.steps if "wall_s" in s]),
    }


def final_loss(session: Session) -> float | None:
    """The last step's loss, where the run recorded one (NaN or inf for a diverged run)."""
    for step in reversed(session.steps):
        loss = step.get("loss")
        if (value := number(loss)) is not None:
            return value
    return None


def memory_peak_bytes(session: Session) -> float | None:
    """The memory peak over the profiled steps (the memory section's ``peak.bytes``)."""
    peak = session.section("memory").get("peak")
    return number(peak.get("bytes")) if isinstance(peak, Mapping) else None


def underflow_fraction(session: Session) -> float | None:
    """The share of nonzero gradient values FP16 lost (zero or subnormal), for FP16 runs.

    The numerics analysis' figure (`ampdiag.analysis.numerics.underflow_summary`, the one
    ``fp16-grad-underflow`` states). For a run that did not compute in FP16 it is what FP16
    would do, not something the run lost: None here (the numerics section shows the what-if).
    """
    numerics = session.section("derived").get("numerics")
    if not numerics or not numerics["underflow"].get("measured", True):
        return None
    fp16 = computes_in(session)["precision"] == "fp16"
    return numerics["underflow"]["underflow_fraction"] if fp16 else None


def skipped_steps(session: Session) -> dict[str, int] | None:
    """Steps the GradScaler skipped (inf/NaN gradients) of the steps it saw; None: no scaler.

    Totals over every step: the history and the step lists are thinned on long runs.
    """
    scaler = session.section("scaler")
    if not scaler.get("present") and not scaler.get("history"):
        return None
    history = [h for h in scaler.get("history") or [] if isinstance(h, Mapping)]
    listed = scaler.get("skipped_steps")
    total = scaler.get("skipped_total")
    if not isinstance(total, int):
        in_history = sum(1 for h in history if h.get("skipped"))
        total = len(listed) if isinstance(listed, list) else in_history
    steps = scaler.get("steps_total")
    if not isinstance(steps, int) or steps <= 0:
        steps = len(history)
    return {"skipped": int(total), "steps": int(steps)}


def loss_scale(session: Session) -> dict[str, float] | None:
    """The GradScaler's scale: first, last and smallest over every step (None: none seen)."""
    scaler = session.section("scaler")
    history = [
        float(h["scale"])
        for h in scaler.get("history") or []
        if isinstance(h, Mapping) and number(h.get("scale")) is not None
    ]
    if not history:
        return None
    smallest = min(history)
    every_step = number(scaler.get("scale_min"))  # every step's, where the history is thinned
    if every_step is not None:
        smallest = min(smallest, every_step)
    return {"first": history[0], "last": history[-1], "min": smallest}


def low_precision_share(session: Session, measure: str) -> float | None:
    """The share of the audited step's FLOPs or op time (casts apart) run in low precision."""
    section = session.section("precision")
    if not section.get("audited"):
        return None
    totals = session.section("derived")["precision"][measure]  # type: ignore[literal-required]
    work = totals["low"] + totals["fp32"]
    return float(totals["low"] / work) if work > 0 else None


def _ab_speed(session: Session) -> SpeedVsFp32 | None:
    probe = session.section("speed_probe")
    run = computes_in(session)["autocast_precision"]
    rows = pc.rows_of(probe.get("precisions"))
    mine, base = rows.get(run or ""), rows.get("fp32")
    if run is None or run == "fp32" or mine is None or base is None:
        return None
    a, b = pc.estimate(mine), pc.estimate(base)  # an interval each (`pc.estimate`)
    if a is None or b is None or min(a.samples, b.samples) < 2 or b.median <= 0 or b.low <= 0:
        return None
    return _speed(
        "precision A/B", run, (b.median, a.median), (b.spread, a.spread), timing.quotient(a, b)
    )


def _speed(
    source: str,
    run: str | None,
    ms: tuple[Any, Any],
    spreads: tuple[Any, Any],
    est: timing.Estimate,
) -> SpeedVsFp32:
    """The figure's fields: FP32's then the run's time and spread (ms), and their ratio."""
    return {
        "source": source,
        "precision": run,
        "fp32_ms": ms[0],
        "run_ms": ms[1],
        "fp32_spread_ms": spreads[0],
        "run_spread_ms": spreads[1],
        "time_ratio": est.median,
        "low": est.low,
        "high": est.high,
        "samples": est.samples,
    }


def probe_ratio(probe: Mapping[str, Any]) -> timing.Estimate | None:
    """Autocast / FP32 time of the probe: the quotient of the two least times (`timing.least`).

    A session that kept only the two headline times (older sessions) gives one sample: no
    interval, so it can only be "uncertain".
    """

    def samples(values: Any) -> list[float]:
        return [v for v in (number(x) for x in values) if v is not None]

    f_all, a_all = probe.get("fp32_ms_all"), probe.get("autocast_ms_all")
    f = samples(f_all if isinstance(f_all, list) else [probe.get("fp32_ms")])
    a = samples(a_all if isinstance(a_all, list) else [probe.get("autocast_ms")])
    if not f or not a or min(f) <= 0:
        return None
    return timing.quotient(timing.least(a), timing.least(f))


def _probe_speed(session: Session) -> SpeedVsFp32 | None:
    probe = session.section("speed_probe")
    fp32, amp = number(probe.get("fp32_ms")), number(probe.get("autocast_ms"))
    est = probe_ratio(probe)
    if fp32 is None or amp is None or est is None:
        return None
    run = computes_in(session)["autocast_precision"]
    spreads = (number(probe.get("fp32_ms_spread")), number(probe.get("autocast_ms_spread")))
    return _speed("speed probe", run, (fp32, amp), spreads, est)


def speed_vs_fp32(session: Session) -> SpeedVsFp32 | None:
    """The run's precision against FP32: time per forward + backward, their ratio and interval.

    From the precision A/B where it timed both (its medians are the tighter), else from the
    speed probe. ``time_ratio`` is the run's time over FP32's (below 1: faster); ``verdict``
    is "faster", "slower" or "tied" (the interval holds 1, or too few samples to tell).
    """
    found = _ab_speed(session) or _probe_speed(session)
    if found is None:
        return None
    side = speed_estimate(found).versus(1.0)
    found["verdict"] = {"above": "slower", "below": "faster", "uncertain": "tied"}[side]
    return found


def speed_estimate(speed: Mapping[str, Any]) -> timing.Estimate:
    """A `speed_vs_fp32` figure as a `timing.Estimate` of the time ratio."""
    return timing.Estimate(
        float(speed["time_ratio"]), float(speed["low"]), float(speed["high"]),
        int(speed["samples"]),
    )  # fmt: skip


@part("figures")
def compute(session: Session) -> Figures:
    """Every headline figure (the derive step stores it as ``derived.figures``)."""
    return {
        "step_time": step_time(session),
        "final_loss": final_loss(session),
        "memory_peak_bytes": memory_peak_bytes(session),
        "underflow_fraction": underflow_fraction(session),
        "skipped_steps": skipped_steps(session),
        "loss_scale": loss_scale(session),
        "low_precision_flops_share": low_precision_share(session, "flops"),
        "low_precision_time_share": low_precision_share(session, "time_us"),
        "speed_vs_fp32": speed_vs_fp32(session),
    }
