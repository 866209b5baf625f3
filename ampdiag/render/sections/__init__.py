"""Report sections: one module per section, each with ``build(session) -> ReportSection | None``.

Renderers (HTML today) walk ``SECTION_MODULES`` in order; a new section is one new module here
and one name in that tuple. A section returns None when the session has nothing for it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

from markupsafe import Markup

from ampdiag.session import Session

SECTION_MODULES: tuple[str, ...] = (
    "overview",
    "ranks",
    "time",
    "timeline",
    "precision",
    "precision_ab",
    "numerics",
    "gradscaler",
    "memory",
    "environment",
)

#: Headings of the sections whose name does not say it (for a section that failed to build).
TITLES = {"time": "Step time", "timeline": "GPU timeline", "gradscaler": "GradScaler"}


@dataclass
class ReportSection:
    """One section of the HTML report.

    Attributes:
        id: The anchor (kebab-case, fixed).
        title: The heading.
        html: The body, already escaped (built from an autoescaping template).
        summary: One line for the navigation and the console.
        figures: Names of the figures it embeds (for tests and TensorBoard).
    """

    id: str
    title: str
    html: Markup
    summary: str = ""
    figures: list[str] = field(default_factory=list)


def section_modules() -> list[ModuleType]:
    """The section modules, in report order.

    Each has ``build(session) -> ReportSection | None`` and may have
    ``write_tensorboard(session, writer)`` for its TensorBoard scalars and histograms.
    """
    return [importlib.import_module(f"ampdiag.render.sections.{n}") for n in SECTION_MODULES]


def build_sections(session: Session) -> list[ReportSection]:
    """Builds every section the session supports, in report order.

    A section that fails to build is replaced by one that says so (with the error): one odd
    value in a session must not cost the user the rest of the report.
    """
    built = []
    for name, module in zip(SECTION_MODULES, section_modules(), strict=True):
        try:
            section = module.build(session)
        except Exception as exc:
            section = failed(name, exc)
        if section is not None:
            built.append(section)
    return built


def failed(name: str, exc: BaseException) -> ReportSection:
    """The stand-in for a section that could not be built."""
    from ampdiag.render.templating import render_template

    html = render_template("failed.html.j2", error=f"{type(exc).__name__}: {exc}")
    title = TITLES.get(name, name.replace("_", " ").capitalize())
    return ReportSection(id=name, title=title, html=html, summary="could not be rendered")
