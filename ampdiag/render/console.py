"""The console summary: the verdict, the top findings with their fixes' first line, the report."""

from __future__ import annotations

from pathlib import Path

from ampdiag.session import Finding, Session

TOP = 5


def _first_code_line(fix: str) -> str:
    for line in fix.splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            return text
    return ""


def _finding_lines(f: Finding) -> list[str]:
    lines = [f"  [{f.severity:>6}] {f.id}: {f.title}"]
    explains = f.evidence.get("explains") if isinstance(f.evidence, dict) else None
    if isinstance(explains, list) and explains:
        lines.append(f"{'':11}explains: {', '.join(str(i) for i in explains)}")
    code = _first_code_line(f.fix)
    if code:
        lines.append(f"{'':11}fix: {code}")
    return lines


def summary(session: Session, report: Path | None = None, top: int = TOP) -> str:
    """A short plain-text summary of a session and its findings."""
    from ampdiag.render.sections.overview import counts, verdict

    env = session.environment
    lines = [
        f"ampdiag: {len(session.steps)} steps, status {session.status}, "
        f"{env.get('device_type', '?')} ({env.get('device_name', '?')}), "
        f"autocast {env.get('autocast') or 'off'}"
    ]
    lines.append(f"  verdict: {verdict(session)}")
    share = session.section("profiler").get("breakdown", {}).get("share", {})
    if share:
        lines.append("  step time: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items()))
    probe = session.section("speed_probe")
    if isinstance(probe.get("fp32_ms"), (int, float)):
        lines.append(
            f"  speed probe: FP32 {probe['fp32_ms']:.3g} ms, {probe.get('autocast')} "
            f"{probe.get('autocast_ms', 0):.3g} ms per forward + backward"
        )
    shown = [f for f in session.findings if f.severity != "info"][:top]
    if shown:
        lines.append(f"  findings ({counts(session)}):")
        for f in shown:
            lines.extend(_finding_lines(f))
        rest = len(session.findings) - len(shown)
        if rest > 0:
            lines.append(f"  ... and {rest} more in the report")
    else:
        lines.append("  no findings above the documented thresholds")
    if report is not None:
        lines.append(f"  report: {report}")
    return "\n".join(lines)
