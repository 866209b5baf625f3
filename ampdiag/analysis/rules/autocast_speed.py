"""autocast-slower: mixed precision measured slower than FP32 on this model and device."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

from ampdiag import timing, units
from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session, Severity

THRESHOLDS = {
    # Autocast time / FP32 time of the probe's forward + backward (speed_probe section).
    "slowdown_medium": 1.10,
    "slowdown_high": 1.50,
}


def step_ms(session: Session) -> timing.Estimate | None:
    """The wall time of the run's steps after the first (warm-up), in ms: median ± MAD."""
    walls = [s.get("wall_s") for s in session.steps[1:] or session.steps]
    values = [float(w) * 1000 for w in walls if isinstance(w, (int, float))]
    return timing.estimate(values) if values else None


def probe_ratio(probe: dict[str, Any]) -> timing.Estimate | None:
    """Autocast / FP32 time of the probe: the quotient of the two medians, with its interval.

    A session that kept only the two headline times (older sessions) gives one sample: no
    interval, so it can only be "uncertain".
    """
    f_all, a_all = probe.get("fp32_ms_all"), probe.get("autocast_ms_all")
    f = _samples(f_all if isinstance(f_all, list) else [probe.get("fp32_ms")])
    a = _samples(a_all if isinstance(a_all, list) else [probe.get("autocast_ms")])
    if not f or not a or statistics.median(f) <= 0:
        return None
    return timing.quotient(timing.estimate(a), timing.estimate(f))


def _samples(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


@rule("autocast-slower")
def autocast_slower(session: Session) -> Iterator[Finding]:
    """The probe's step under autocast takes >= 1.10x (medium), >= 1.50x (high) its FP32 time.

    The ratio is the quotient of the medians of interleaved passes, with the interval their
    spreads allow (`ampdiag.timing`); the thresholds are compared with that interval, so the
    severity is that of its lower end. An interval that straddles 1.10x (or a single pair)
    is reported as uncertain (info, with the interval): a loaded machine says it cannot tell
    rather than flipping between runs. Evidence: both median times, the ratio and its
    interval, the run's median step time and the step time FP32 would give at the measured
    ratio, and the leaf modules
    that slowed down most.
    """
    probe = session.section("speed_probe")
    fp32, amp = probe.get("fp32_ms"), probe.get("autocast_ms")
    est = probe_ratio(dict(probe))
    if not isinstance(fp32, (int, float)) or not isinstance(amp, (int, float)) or est is None:
        return
    side = est.versus(THRESHOLDS["slowdown_medium"])
    if side == "below":
        return
    env = session.environment
    autocast = str(probe.get("autocast") or env.get("autocast") or "?")
    device, _, dtype = autocast.partition(":")
    interval = {
        "slowdown": round(est.median, 3),
        "slowdown_low": round(est.low, 3),
        "slowdown_high": round(est.high, 3),
        "pairs": est.samples,
        "threshold": THRESHOLDS["slowdown_medium"],
    }
    if side == "uncertain":
        yield _uncertain(autocast, est, interval)
        return
    ratio = est.median
    severity: Severity = "high" if est.low >= THRESHOLDS["slowdown_high"] else "medium"
    evidence: dict[str, Any] = {
        "autocast": autocast,
        "fp32_ms": fp32,
        "autocast_ms": amp,
        **interval,
        "measured": f"{probe.get('measured', 'forward + backward')}, median of "
        f"{est.samples} interleaved pairs each",
    }
    step = step_ms(session)
    if step is not None:
        evidence["step_ms"] = round(step.median, 3)
        evidence["step_ms_spread"] = round(step.spread, 3)
        evidence["estimated_fp32_step_ms"] = round(step.median / ratio, 3)
    slowed = [
        m
        for m in probe.get("modules", [])
        if isinstance(m, dict) and m.get("autocast_ms", 0) > m.get("fp32_ms", 0)
    ][:3]
    if slowed:
        evidence["slowest_modules"] = [
            f"{m['module']}: {units.micros(m['fp32_ms'] * 1e3)} -> "
            f"{units.micros(m['autocast_ms'] * 1e3)}"
            for m in slowed
        ]
    if device == "cpu":
        native = env.get("bf16_native")
        evidence["bf16_native"] = native
        evidence["cpu_flags"] = env.get("cpu_flags")
        why = (
            "this CPU has no native BF16/FP16 matmul (no AVX512_BF16 / AMX): autocast converts "
            "and emulates"
            if native is False
            else "for this model size the casts cost more than the low-precision kernels save"
        )
        fix = (
            f"# Autocast on this CPU is {ratio:.1f}x slower: {why}.\n"
            "# Train in FP32 here and keep autocast for the GPU:\n"
            "use_amp = device.type == 'cuda'\n"
            f"with torch.autocast(device_type=device.type, dtype=torch.{dtype or 'bfloat16'}, "
            "enabled=use_amp):\n"
            "    loss = loss_fn(model(x), y)"
        )
    else:
        fix = (
            f"# Autocast is {ratio:.1f}x slower than FP32 on this model: casts and small "
            "kernels dominate.\n"
            "# Make the matmuls large enough to pay for the casts (batch and hidden sizes that "
            "are\n# multiples of 8), see fp32-ops-in-autocast for casts back and forth, or train "
            "in FP32:\n"
            "torch.backends.cuda.matmul.allow_tf32 = True   # fast FP32 matmuls on Ampere+\n"
            f"with torch.autocast(device_type='cuda', dtype=torch.{dtype or 'float16'}, "
            "enabled=False):\n"
            "    loss = loss_fn(model(x), y)"
        )
    yield Finding(
        id="autocast-slower",
        severity=severity,
        title=(
            f"Mixed precision ({autocast}) is {ratio:.2f}x ({est.low:.2f}x-{est.high:.2f}x) slower "
            "than FP32 on this model: "
            f"{units.micros(amp * 1e3)} vs {units.micros(fp32 * 1e3)} per forward + backward."
        ),
        evidence=evidence,
        fix=fix,
        section="time",
        impact=1 - 1 / ratio,
    )


def _uncertain(autocast: str, est: timing.Estimate, interval: dict[str, Any]) -> Finding:
    """The info finding for a ratio whose interval straddles the threshold."""
    why = timing.why_uncertain(est, THRESHOLDS["slowdown_medium"], "timed pair", "{:.2f}x")
    return Finding(
        id="autocast-slower",
        severity="info",
        title=(
            f"Mixed precision ({autocast}) may be slower than FP32 here "
            f"({est.median:.2f}x, between {est.low:.2f}x and {est.high:.2f}x over {est.samples} "
            f"pairs), but it could not be measured reliably: {why}."
        ),
        evidence={"autocast": autocast, **interval, "uncertain": why},
        fix=(
            "# Time it on a quiet machine, with more pairs:\n"
            "with ampdiag.diagnose(speed_probe_repeats=20, speed_probe_budget_s=30): ...\n"
            "# or measure every precision directly:\n"
            "ampdiag.compare(model, batch, loss_fn=loss_fn, budget_s=30)"
        ),
        section="time",
        impact=0.0,
    )
