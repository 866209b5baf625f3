"""autocast-slower: mixed precision measured slower than FP32 on this model and device."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

from ampdiag import units
from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session, Severity

THRESHOLDS = {
    # Autocast time / FP32 time of the probe's forward + backward (speed_probe section).
    "slowdown_medium": 1.10,
    "slowdown_high": 1.50,
}


def median_step_ms(session: Session) -> float | None:
    """The median wall time of the run's steps after the first (warm-up), in ms."""
    walls = [s.get("wall_s") for s in session.steps[1:] or session.steps]
    values = [float(w) * 1000 for w in walls if isinstance(w, (int, float))]
    return statistics.median(values) if values else None


@rule("autocast-slower")
def autocast_slower(session: Session) -> Iterator[Finding]:
    """The probe's step under autocast takes >= 1.10x (medium), >= 1.50x (high) its FP32 time.

    Evidence: both times (best of interleaved forward + backward passes on the run's own model
    and batch), the ratio, the run's median step time and the step time FP32 would give
    at the measured ratio, and the leaf modules that slowed down most.
    """
    probe = session.section("speed_probe")
    fp32, amp = probe.get("fp32_ms"), probe.get("autocast_ms")
    if not isinstance(fp32, (int, float)) or not isinstance(amp, (int, float)) or fp32 <= 0:
        return
    ratio = amp / fp32
    if ratio < THRESHOLDS["slowdown_medium"]:
        return
    severity: Severity = "high" if ratio >= THRESHOLDS["slowdown_high"] else "medium"
    env = session.environment
    autocast = str(probe.get("autocast") or env.get("autocast") or "?")
    device, _, dtype = autocast.partition(":")
    evidence: dict[str, Any] = {
        "autocast": autocast,
        "fp32_ms": fp32,
        "autocast_ms": amp,
        "slowdown": round(ratio, 3),
        "measured": f"{probe.get('measured', 'forward + backward')}, best of "
        f"{probe.get('repeats', '?')} interleaved pairs",
        "threshold": THRESHOLDS["slowdown_medium"],
    }
    step = median_step_ms(session)
    if step is not None:
        evidence["step_ms"] = round(step, 3)
        evidence["estimated_fp32_step_ms"] = round(step / ratio, 3)
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
            f"Mixed precision ({autocast}) is {ratio:.2f}x slower than FP32 on this model: "
            f"{units.micros(amp * 1e3)} vs {units.micros(fp32 * 1e3)} per forward + backward."
        ),
        evidence=evidence,
        fix=fix,
        section="time",
        impact=1 - 1 / ratio,
    )
