"""The HTML report: one self-contained file (inline CSS, figures as data URIs, no network).

Layout: the overview first (the verdict in a sentence, the top recommendations with their fixes,
every finding in a table that links to it), then one section per topic -- time, precision,
numerics, memory, GradScaler -- and the environment. A topic no collector filled still gets its
section, saying what it would need, so the report's shape (and its anchors) never change. Each
finding is shown in full in its topic's section (anchor ``#finding-<id>``). The navigation is
anchors, the details are ``<details>`` elements, hover values are SVG ``<title>``s; one small
inline script (templates/report.js) sorts tables and zooms the step charts. The
Content-Security-Policy forbids every network access and every script but that one, by hash.
"""

from __future__ import annotations

import base64
import hashlib
import html as html_lib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from markupsafe import Markup

from ampdiag._layout import REPORT_FILE
from ampdiag.render.sections import ReportSection, build_sections, registry
from ampdiag.render.sections.overview import lead
from ampdiag.render.templating import page, page_css, render_template
from ampdiag.session import Finding, Session

TOP_RECOMMENDATIONS = 3


@dataclass
class ShownFinding:
    """A finding with its anchor in the report and the section that shows it in full."""

    f: Finding
    anchor: str
    section: str


def anchors(findings: list[Finding], shown_in: set[str]) -> list[ShownFinding]:
    """Unique anchors (``finding-<id>``, ``finding-<id>-2``...) and where each finding lives."""
    seen: dict[str, int] = {}
    out = []
    for f in findings:
        n = seen[f.id] = seen.get(f.id, 0) + 1
        anchor = f"finding-{f.id}" if n == 1 else f"finding-{f.id}-{n}"
        out.append(ShownFinding(f, anchor, f.section if f.section in shown_in else "overview"))
    return out


def _placeholder(topic: str, title: str, needs: str, session: Session) -> ReportSection:
    html = render_template("placeholder.html.j2", needs=needs, source=session.environment)
    return ReportSection(id=topic, title=title, html=html, summary="no data")


def arrange(session: Session, built: list[ReportSection]) -> list[ReportSection]:
    """Adds the missing topic sections and puts every section in report order.

    The order is `SECTION_MODULES`'; a section of no registered module (a caller's own) goes
    before the environment, which closes the report.
    """
    sections = list(built)
    have = {s.id for s in sections}
    # a CUDA snapshot has memory and nothing else: no empty live-run sections beside it
    snapshot = bool(session.section("memory").get("snapshot_file")) and not session.steps
    for section in registry():
        if section.needs is not None and section.id not in have and not snapshot:
            sections.append(_placeholder(section.id, section.title, section.needs, session))
    order = {section.id: i for i, section in enumerate(registry())}
    last = order.get("environment", len(order))
    return sorted(sections, key=lambda s: order.get(s.id, last - 0.5))


def _asset(name: str) -> str:
    return resources.files("ampdiag.render").joinpath(f"templates/{name}").read_text("utf-8")


def script_and_hash() -> tuple[Markup, str]:
    """The report's one script and its CSP source (``'sha256-...'``).

    The policy allows exactly this script and no other, inline or fetched.
    """
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return Markup(script), f"'sha256-{digest}'"  # our own file, not user text


def render_html(session: Session, sections: list[ReportSection] | None = None) -> str:
    """Returns the report as one HTML document."""
    script, script_src = script_and_hash()
    sections = arrange(session, build_sections(session) if sections is None else sections)
    shown = anchors(session.findings, {s.id for s in sections} - {"overview"})
    by_section: dict[str, list[ShownFinding]] = {}
    for item in shown:
        by_section.setdefault(item.section, []).append(item)
    titles = {s.id: s.title for s in sections}
    env = session.environment
    title = " · ".join(str(x) for x in (env.get("device_name"), env.get("autocast") or None) if x)
    folder = str(session.path) if session.path is not None else "DIR"
    stated = lead(session)
    return str(
        render_template(
            "report.html.j2",
            session=session,
            sections=sections,
            shown=shown,
            by_section=by_section,
            titles=titles,
            top=[s for s in shown if s.f.severity != "info"][:TOP_RECOMMENDATIONS],
            css=page_css(),
            script=script,
            script_src=script_src,
            title=title,
            folder=folder,
            lead=stated,
        )
    )


def fallback_html(session: Session, exc: BaseException) -> str:
    """A plain report (findings as text) for when the full one cannot be rendered at all.

    Each section already fails alone (`build_sections`); this is for a failure outside them,
    so that the user still gets the findings and the reason instead of no file.
    """
    e = html_lib.escape
    parts = [
        f"<article><h3>{e(f.severity)} <code>{e(f.id)}</code></h3><p>{e(str(f.title))}</p>"
        f"<pre>{e(str(f.fix))}</pre></article>"
        for f in session.findings
    ]
    body = (
        "<h1>ampdiag report</h1><p>The full report could not be rendered from this session: "
        f"<code>{e(type(exc).__name__)}: {e(str(exc))}</code>. The findings follow; "
        "everything collected is in <code>session.json</code>.</p>" + "".join(parts)
    )
    return page("ampdiag report", Markup(body))  # every part escaped above


def write_html(session: Session, out: Path) -> Path:
    """Writes out/report.html and returns its path (a plain one if the full one fails)."""
    target = out / REPORT_FILE
    tmp = target.with_suffix(".html.tmp")
    try:
        text = render_html(session)
    except Exception as exc:
        text = fallback_html(session, exc)
    # errors="replace": a lone surrogate (a name decoded with surrogateescape, say) becomes "?"
    # instead of costing the whole file.
    tmp.write_bytes(text.encode("utf-8", errors="replace"))
    tmp.replace(target)
    return target
