"""The console summary: the verdict, the top findings with their whole fixes, the report.

Prose is wrapped to the terminal's width; code lines of a fix are kept as they are (indented),
since a wrapped line of code no longer runs.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from ampdiag import units as humanize
from ampdiag.render import stated
from ampdiag.render.templating import merged_fixes
from ampdiag.session import Finding, Session

TOP = 5
INDENT = " " * 11
MAX_WIDTH = 100


def _width() -> int:
    return max(60, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def _wrap(text: str, first: str, rest: str, width: int) -> list[str]:
    return textwrap.wrap(
        text, width=width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _is_code(line: str) -> bool:
    """A line of Python (kept whole, or it no longer runs) rather than a sentence (wrapped).

    A comment, or a line that compiles on its own or as the header of a block
    (``with torch.autocast(...):``). A sentence does not compile, even one ending in a colon.
    """
    s = line.strip()
    if line[:1].isspace() or s.startswith("#"):
        return True
    for source in (s, s + "\n    pass"):
        try:
            compile(source, "<fix>", "exec")
        except (SyntaxError, ValueError):
            continue
        return True
    return False


def _fix_lines(label: str, fix: str, width: int) -> list[str]:
    """A whole fix: prose wrapped under the label, code lines kept whole.

    Code keeps its own indentation under a common margin so it can be copied as it is; a long
    comment is wrapped into further comment lines (still valid code).
    """
    lines: list[str] = []
    head = f"{INDENT}{label}: "
    code = INDENT + "    "
    for line in fix.strip().splitlines():
        if not line.strip():
            continue
        if not _is_code(line):
            lines.extend(
                _wrap(line.strip(), head if not lines else INDENT + "  ", INDENT + "  ", width)
            )
            continue
        if not lines:
            lines.append(head.rstrip())
        body = line.rstrip()
        margin = body[: len(body) - len(body.lstrip())]
        if body.lstrip().startswith("#") and len(code + body) > width:
            text = body.lstrip().lstrip("#").strip()
            lines.extend(_wrap(text, code + margin + "# ", code + margin + "# ", width))
        else:
            lines.append(code + body)
    return lines


def _finding_lines(f: Finding, width: int) -> list[str]:
    lines = _wrap(f"{f.id}: {f.title}", f"  [{f.severity:>6}] ", INDENT, width)
    explains = f.evidence.get("explains") if isinstance(f.evidence, dict) else None
    if isinstance(explains, list) and explains:
        lines.extend(
            _wrap(", ".join(str(i) for i in explains), f"{INDENT}explains: ", INDENT + "  ", width)
        )
    if f.fix:
        lines.extend(_fix_lines("fix", f.fix, width))
    for mid, fix in merged_fixes(f):
        lines.extend(_fix_lines(f"fix for {mid}", fix, width))
    return lines


def summary(session: Session, report: Path | None = None, top: int = TOP) -> str:
    """A short plain-text summary of a session and its findings."""
    from ampdiag.render.sections.overview import budget_notes, counts, run_facts, verdict

    lines = ["ampdiag: " + ", ".join(run_facts(session))]
    width = _width()
    lines.extend(_wrap(verdict(session), "  verdict: ", INDENT, width))
    for note in budget_notes(session):
        lines.extend(_wrap(note, "  budget: ", INDENT, width))
    share = session.section("profiler").get("breakdown", {}).get("share", {})
    if share:
        lines.append(
            "  step time: " + ", ".join(f"{k} {humanize.percent(v)}" for k, v in share.items())
        )
    cuda_peak = (session.section("memory").get("cuda") or {}).get("peak") or {}
    if cuda_peak.get("allocated_bytes"):
        sites = cuda_peak.get("top_sites") or []
        lines.append(
            f"  CUDA allocator peak: {humanize.nbytes(cuda_peak['allocated_bytes'])} allocated, "
            f"{humanize.nbytes(cuda_peak.get('reserved_bytes'))} reserved"
            + (f"; largest site {sites[0].get('site')}" if sites and sites[0].get("site") else "")
        )
    speed = stated.figures(session).get("speed_vs_fp32")
    if isinstance(speed, dict):
        autocast = stated.autocast(session)
        tied = {"faster": "faster", "slower": "slower", "tied": "tied within the spread"}
        lines.append(
            f"  {speed['source']}: FP32 {humanize.micros(speed['fp32_ms'] * 1e3)}, "
            f"{autocast} {humanize.micros(speed['run_ms'] * 1e3)} per forward + backward "
            f"({speed['time_ratio']:.2f}x the time, {speed['low']:.2f}-{speed['high']:.2f}x: "
            f"{tied.get(str(speed.get('verdict')), speed.get('verdict'))})"
        )
    shown = [f for f in session.findings if f.severity != "info"][:top]
    if shown:
        lines.append(f"  findings ({counts(session)}):")
        for f in shown:
            lines.extend(_finding_lines(f, width))
        rest = len(session.findings) - len(shown)
        if rest > 0:
            lines.append(f"  ... and {rest} more in the report")
    else:
        lines.append("  no findings above the documented thresholds")
    if report is not None:
        lines.append(f"  report: {report}")
    return "\n".join(lines)
