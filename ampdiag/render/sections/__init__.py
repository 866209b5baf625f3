"""Report sections: one module per section, each with ``build(session) -> ReportSection | None``.

A new section is one new module here and one line in `SECTION_MODULES` (`SECTIONS`, an
`ampdiag.registry.Registry`), which is the order the report shows them in. A module registers
its ``build`` with ``@section(title, needs)``: its heading, ``needs`` for a *topic* (a section
every report has: with no data it still shows, saying what would fill it); ``build`` returns
None when the session has nothing for it. The HTML
report draws them; TensorBoard output is `ampdiag.render.tensorboard`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from markupsafe import Markup

from ampdiag.registry import Registry
from ampdiag.session import Session

#: The report's sections, one module each, in the order the report shows them.
SECTION_MODULES: tuple[str, ...] = (
    "overview",
    "ranks",
    "time",
    "timeline",
    "precision",
    "numerics",
    "weights",
    "memory",
    "gradscaler",
    "precision_ab",
    "settings",
    "environment",
)


@dataclass(frozen=True)
class SectionInfo:
    """What a section module registers: anchor, heading, what fills a topic, and its build."""

    id: str
    title: str
    needs: str | None
    build: Build


@dataclass
class ReportSection:
    """One section of the HTML report.

    Attributes:
        id: The anchor (kebab-case, fixed).
        title: The heading.
        html: The body, already escaped (`Markup`).
        summary: One line for the navigation and the console.
        figures: Names of the figures it embeds (for tests and TensorBoard).
    """

    id: str
    title: str
    html: Markup
    summary: str = ""
    figures: list[str] = field(default_factory=list)


Build = Callable[[Session], "ReportSection | None"]

SECTIONS: Registry[SectionInfo] = Registry(__name__, SECTION_MODULES)


def section(title: str, needs: str | None = None) -> Callable[[Build], Build]:
    """Registers a section module's ``build`` (its anchor: the module's name, kebab-case)."""

    def register(build: Build) -> Build:
        anchor = build.__module__.rsplit(".", 1)[-1].replace("_", "-")
        SECTIONS.add(SectionInfo(anchor, title, needs, build), build.__module__)
        return build

    return register


def registry() -> list[SectionInfo]:
    """The registered sections, in report order (their modules imported)."""
    return SECTIONS.entries()


def build_sections(session: Session) -> list[ReportSection]:
    """Builds every section the session supports, in report order.

    A section that fails to build is replaced by one that says so (with the error): one odd
    value in a session must not cost the user the rest of the report.
    """
    built = []
    for info in registry():
        try:
            section = info.build(session)
        except Exception as exc:
            section = failed(info, exc)
        if section is not None:
            built.append(section)
    return built


def failed(info: SectionInfo, exc: BaseException) -> ReportSection:
    """The stand-in for a section that could not be built."""
    html = Markup(
        '<p class="error">This section could not be rendered from this session: '
        "<code>{}: {}</code>. "
        "The data is in <code>session.json</code>; the other sections are complete.</p>"
    ).format(type(exc).__name__, exc)
    return ReportSection(id=info.id, title=info.title, html=html, summary="could not be rendered")
