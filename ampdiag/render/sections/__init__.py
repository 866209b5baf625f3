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
    "numerics",
    "gradscaler",
    "memory",
    "environment",
)


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
    """Builds every section the session supports, in report order."""
    built = []
    for module in section_modules():
        section = module.build(session)
        if section is not None:
            built.append(section)
    return built
