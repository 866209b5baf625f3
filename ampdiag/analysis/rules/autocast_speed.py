"""autocast-slower: mixed precision measured slower than FP32 on this model and device."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ampdiag import timing, units
from ampdiag.analysis import figures
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.advisors import terms
from ampdiag.analysis.compute import NAMES, computes_in
from ampdiag.analysis.derive import derived
from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Autocast time / FP32 time of the probe's forward + backward (speed_probe section):
    # medium from this lower end up, never high (a measured speed is a loaded machine's,
    # whose size moves between identical runs: `advisors.recommendations.Thresholds`).
    slowdown_medium: float = 1.10


THRESHOLDS = Thresholds()


@rule("autocast-slower")
def autocast_slower(session: Session) -> Iterator[Finding]:
    """The step under autocast takes >= 1.10x its FP32 time (medium; a speed claim is never high).

    The ratio is the run's one figure of its precision against FP32
    (`ampdiag.analysis.figures.speed_vs_fp32`), so this finding, the time section and "Which
    precision" state one number. The thresholds are compared with its interval (the least times
    of interleaved passes up to their second-least: another process's load only adds time), so
    the severity is that of its lower end; an interval that straddles 1.10x (or a single pair) is
    info: a loaded machine says it cannot tell rather than flipping between runs.

    The cause is measured per module by the precision A/B (`cause_of`): the low-precision kernels
    themselves slower than FP32's (a CPU without native FP16), or the casts eating the gain. The
    fix follows the A/B's choice (`precision_choice`); where it keeps the run's own precision the
    slowdown is not confirmed and the finding is info.
    """
    probe = session.section("speed_probe")
    speed = derived(session).get("figures", {}).get("speed_vs_fp32")
    if not isinstance(speed, dict):
        return
    fp32, amp = float(speed["fp32_ms"]), float(speed["run_ms"])
    est = figures.speed_estimate(speed)
    by_ab = speed.get("source") == "precision A/B"
    side = est.versus(THRESHOLDS.slowdown_medium)
    if side == "below":
        return
    env = session.environment
    autocast = str(probe.get("autocast") or computes_in(session)["autocast"] or "?")
    device, _, dtype = autocast.partition(":")
    interval = {
        "slowdown": round(est.median, 3),
        "slowdown_low": round(est.low, 3),
        "slowdown_high": round(est.high, 3),
        "pairs": est.samples,
        "threshold": THRESHOLDS.slowdown_medium,
    }
    run = str(speed.get("precision"))
    once = pc.rows_of(probe.get("precisions")).get(run, {})
    measured = f"{probe.get('measured', 'forward + backward')}, " + (
        f"the precision A/B's least times ({pc.NAMES.get(run, run)} one round: its pass "
        f"{float(once['one_round']):.1f}x the fastest's least, timed no more)"
        if by_ab and once.get("one_round")
        else f"the precision A/B's least times (each of at least {est.samples} interleaved passes)"
        if by_ab
        else f"median of {est.samples} interleaved pairs each (speed probe)"
    )
    if side == "uncertain":
        yield _uncertain(autocast, est, {**interval, "measured": measured})
        return
    ratio = est.median
    severity: Severity = "medium"
    evidence: dict[str, Any] = {
        "autocast": autocast,
        "fp32_ms": fp32,
        "autocast_ms": amp,
        **interval,
        "measured": measured,
    }
    # the run's step time in ms, median ± MAD, over the steps its step-time figure counts
    if walls := [w * 1000 for w in figures.step_walls_s(session)]:
        step = timing.estimate(walls)
        # unrounded: the run's step-time figure, which every surface rounds once for display
        evidence["step_ms"] = step.median
        evidence["step_ms_spread"] = round(step.spread, 3)
        evidence["estimated_fp32_step_ms"] = round(step.median / ratio, 3)
    if device == "cpu":
        evidence["bf16_native"] = env.get("bf16_native")
        evidence["cpu_flags"] = env.get("cpu_flags")
    ab = pc.measured(session)
    cause = cause_of(ab, probe.get("modules", []), evidence)
    fix, confirmed = _fix(session, ab, ratio, cause, device, dtype)
    if not confirmed:
        severity = "info"
        evidence["uncertain"] = (
            "the precision A/B measured no safe precision clearly faster than the run's "
            f"(a speed-up whose lower end is at least {pc.SWITCH_SPEEDUP:.2f}x)"
        )
    yield Finding(
        id="autocast-slower",
        severity=severity,
        title=(
            f"Mixed precision ({autocast}) is {ratio:.2f}x ({est.low:.2f}x-{est.high:.2f}x) slower "
            "than FP32 on this model: "
            f"{units.micros(amp * 1e3)} vs {units.micros(fp32 * 1e3)} per forward + backward"
            + (f"; {CAUSES[cause]}" if cause in CAUSES else "")
            + (
                "."
                if confirmed
                else ", but the precision A/B measured no safe precision clearly faster"
                " (uncertain)."
            )
        ),
        evidence=evidence,
        fix=fix,
        section="time",
        impact=1 - 1 / ratio,
    )


def _uncertain(autocast: str, est: timing.Estimate, interval: dict[str, Any]) -> Finding:
    """The info finding for a ratio whose interval straddles the threshold."""
    why = timing.why_uncertain(est, THRESHOLDS.slowdown_medium, "timed pair", "{:.2f}x")
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
            "with ampdiag.diagnose(speed_probe_repeats=20, precision_ab_budget_s=30): ...\n"
            "# or measure every precision directly:\n"
            "ampdiag.compare(model, batch, loss_fn=loss_fn, budget_s=30)"
        ),
        section="time",
        impact=0.0,
    )


CAUSES = {
    "kernels": "its low-precision kernels themselves are slower than FP32's",
    "casts": "the casts cost more than the low-precision kernels save",
}


def cause_of(ab: pc.Measured, probe_modules: Any, evidence: dict[str, Any]) -> str | None:
    """The measured cause of the slowdown ("kernels" / "casts"), with per-module evidence.

    From the A/B row of the run's precision (`compare._module_costs`): each leaf module's
    forward in FP32, in the low precision, and the casts inside it. The cause of the whole is
    the larger of the two extra times summed over the slowed modules: the kernels' (low-
    precision time less casts, less FP32 time) or the casts'. Without an A/B only the quick
    probe's per-module times are shown and the cause is not measured (None).
    """
    row = ab.rows.get(ab.run or "", {})
    modules = [m for m in row.get("modules") or [] if isinstance(m, dict) and "cause" in m]
    if modules:
        kernels = sum(max(0.0, m["kernel_ms"] - m["fp32_ms"]) for m in modules)
        casts = sum(m["cast_ms"] for m in modules)
        evidence["slowest_modules"] = [
            f"{m['module']}: {units.micros(m['fp32_ms'] * 1e3)} -> "
            f"{units.micros(m['ms'] * 1e3)} (casts {units.micros(m['cast_ms'] * 1e3)}, "
            f"{m['cause']})"
            for m in modules[:3]
        ]
        evidence["module_causes"] = {m["module"]: m["cause"] for m in modules}
        evidence["extra_kernel_ms"] = round(kernels, 4)
        evidence["cast_ms"] = round(casts, 4)
        cause = "kernels" if kernels >= casts else "casts"
        evidence["cause"] = cause
        return cause
    slowed = [
        m
        for m in probe_modules
        if isinstance(m, dict) and m.get("autocast_ms", 0) > m.get("fp32_ms", 0)
    ][:3]
    if slowed:
        evidence["slowest_modules"] = [
            f"{m['module']}: {units.micros(m['fp32_ms'] * 1e3)} -> "
            f"{units.micros(m['autocast_ms'] * 1e3)}"
            for m in slowed
        ]
    evidence["cause"] = None
    return None


def _fix(
    session: Session, ab: pc.Measured, ratio: float, cause: str | None, device: str, dtype: str
) -> tuple[str, bool]:
    """The fix, and whether the A/B confirms the slowdown (False: it measured no slowdown)."""
    run = NAMES.get(dtype)
    why = (
        f"# Autocast is {ratio:.1f}x slower here: {CAUSES.get(cause or '', 'cause not measured')}."
    )
    if ab.choice is not None and run is not None:
        if ab.choice.precision == run:
            return (
                f"# No change: the precision A/B measured no safe precision at least "
                f"{pc.SWITCH_SPEEDUP:.2f}x faster than {pc.NAMES.get(run, run)}\n# (the lower "
                "end of its interval); this quicker probe's slowdown is not confirmed.",
                False,
            )
        target = ab.choice.precision
        return (
            f"{why}\n# The precision A/B measured {pc.NAMES.get(target, target)} the fastest "
            f"safe precision (see prefer-{'fp32' if target == 'tf32' else target}):\n"
            + terms.precision_fix(session, target, terms.training_step(target, device or "cpu")),
            True,
        )
    env = session.environment
    note = f"\n# Not measured by the precision A/B: {ab.why_not}." if ab.why_not else ""
    bf16_fast = dtype == "float16" and pc.bf16_runs_natively(env, device)
    if bf16_fast:
        return (
            f"{why}{note}\n# This device runs BF16 natively: try BF16, else train in FP32.\n"
            + terms.precision_fix(session, "bf16", terms.training_step("bf16", device or "cpu")),
            True,
        )
    if device == "cpu" and env.get("bf16_native") is False:
        why += (
            "\n# This CPU has no native BF16/FP16 matmul (no AVX512_BF16 / AMX): autocast "
            "converts and emulates."
        )
    fp32 = terms.training_step("fp32", device or "cpu")
    return f"{why}{note}\n" + terms.precision_fix(session, "fp32", fp32), True
