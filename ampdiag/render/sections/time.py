"""Where the step time goes.

The host breakdown per step, step wall times, the top ops, and the speed probe (the same step
in FP32 and under autocast).
"""

from __future__ import annotations

from typing import Any

from ampdiag.render import plots
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session
from ampdiag.trace.step_breakdown import CATEGORIES


def figures(session: Session) -> dict[str, bytes]:
    """The section's figures as PNG bytes, by name (shared by the HTML and TensorBoard)."""
    prof = session.section("profiler")
    probe = session.section("speed_probe")
    steps = session.steps
    out: dict[str, bytes] = {}
    rows = prof.get("breakdown", {}).get("steps", [])
    if rows:
        series = {c: [r[f"{c}_us"] / 1000 for r in rows] for c in CATEGORIES}
        out["step-breakdown"] = plots.stacked_bar(
            [f"step {r['step']}" for r in rows], series, "ms", "Host time per profiled step"
        )
    if len(steps) >= 2:
        out["step-times"] = plots.line(
            [s["index"] for s in steps],
            {"wall time": [s["wall_s"] * 1000 for s in steps]},
            "step",
            "ms",
            "Wall time per step",
        )
    if isinstance(probe.get("fp32_ms"), (int, float)):
        out["speed-probe"] = plots.hbar(
            ["FP32", str(probe.get("autocast") or "autocast")],
            [float(probe["fp32_ms"]), float(probe.get("autocast_ms") or 0.0)],
            "ms per forward + backward (best of the samples)",
            "Speed probe: the same step in FP32 and under autocast",
        )
    return out


def build(session: Session) -> ReportSection | None:
    """The time section, when there are steps, a profile or a speed probe."""
    prof = session.section("profiler")
    probe = session.section("speed_probe")
    steps = session.steps
    if not prof and not steps and not probe.get("fp32_ms"):
        return None
    uris = {name: plots.data_uri(png) for name, png in figures(session).items()}
    html = render_template(
        "time.html.j2", prof=prof, probe=probe, steps=steps, figures=uris, categories=CATEGORIES
    )
    share = prof.get("breakdown", {}).get("share", {})
    summary = ", ".join(f"{c} {share[c]:.0%}" for c in CATEGORIES if c in share)
    return ReportSection(
        id="time", title="Step time", html=html, summary=summary, figures=list(uris)
    )


def write_tensorboard(session: Session, writer: Any) -> None:
    """The speed probe's two times and the section's figures."""
    from ampdiag.render.tensorboard import add_png

    probe = session.section("speed_probe")
    for key in ("fp32_ms", "autocast_ms"):
        if isinstance(probe.get(key), (int, float)):
            writer.add_scalar(f"speed_probe/{key}", float(probe[key]), 0)
    for name, png in figures(session).items():
        add_png(writer, f"figures/time/{name}", png)
