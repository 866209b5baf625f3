"""The HTML report: one self-contained file (inline CSS, figures as data URIs, no network)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ampdiag.render.sections import ReportSection, build_sections
from ampdiag.render.templating import render_template
from ampdiag.session import Session

REPORT_FILE = "report.html"


def render_html(session: Session, sections: list[ReportSection] | None = None) -> str:
    """Returns the report as one HTML document."""
    css = resources.files("ampdiag.render").joinpath("templates/report.css").read_text("utf-8")
    sections = build_sections(session) if sections is None else sections
    env = session.environment
    title = " · ".join(str(x) for x in (env.get("device_name"), env.get("autocast") or None) if x)
    folder = str(session.path) if session.path is not None else "DIR"
    return str(
        render_template(
            "report.html.j2",
            session=session,
            sections=sections,
            css=css,
            title=title,
            folder=folder,
        )
    )


def write_html(session: Session, out: Path) -> Path:
    """Writes out/report.html and returns its path."""
    target = out / REPORT_FILE
    tmp = target.with_suffix(".html.tmp")
    tmp.write_text(render_html(session), encoding="utf-8")
    tmp.replace(target)
    return target
