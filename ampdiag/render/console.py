"""The console summary: where the report is and the top findings, in a few lines."""

from __future__ import annotations

from pathlib import Path

from ampdiag.session import Session

TOP = 5


def summary(session: Session, report: Path | None = None, top: int = TOP) -> str:
    """A short plain-text summary of a session and its findings."""
    env = session.environment
    lines = [
        f"ampdiag: {len(session.steps)} steps, status {session.status}, "
        f"{env.get('device_type', '?')} ({env.get('device_name', '?')}), "
        f"autocast {env.get('autocast') or 'off'}"
    ]
    share = session.section("profiler").get("breakdown", {}).get("share", {})
    if share:
        lines.append("  step time: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()))
    shown = [f for f in session.findings if f.severity != "info"][:top]
    if shown:
        lines.append("  findings:")
        lines.extend(f"  [{f.severity:>6}] {f.id}: {f.title}" for f in shown)
        rest = len(session.findings) - len(shown)
        if rest > 0:
            lines.append(f"  ... and {rest} more in the report")
    else:
        lines.append("  no findings above the documented thresholds")
    if report is not None:
        lines.append(f"  report: {report}")
    return "\n".join(lines)
