"""The derive step: every figure the reports show that is computed, not collected.

Runs in `ampdiag.analysis.analyze` and stores its results on the Session as the ``derived``
section, so renderers only format what is there (and a saved session re-renders without any
analysis code): the precision summary of the audited step (with the fix for each FP32 reason
seen), the memory what-if estimates, the FP16 underflow figures, and last the headline figures
every surface states (`ampdiag.analysis.figures`: step time, loss, peak, skipped steps, speed
against FP32). A part whose input is missing is left out; a renderer says "not measured" for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ampdiag.registry import Registered, Registry
from ampdiag.schema import DerivedSection
from ampdiag.session import Session

#: What computes a part (None when the session has no input for it).
Part = Callable[[Session], Mapping[str, Any] | None]
P = TypeVar("P", bound=Part)

#: The modules of `ampdiag.analysis` that register a part (`part`), in the order they run:
#: the headline figures last, as they read the parts above.
PARTS: Registry[Registered[Part]] = Registry(
    "ampdiag.analysis",
    (
        "compute",
        "precision",
        "memory_estimates",
        "numerics",
        "divergence",
        "fp8",
        "precision_choice",
        "figures",
    ),
    ids=lambda r: r.ids,
)


def part(name: str) -> Callable[[P], P]:
    """Registers a function as the derived part ``name`` (``derived[name]``)."""

    def register(func: P) -> P:
        PARTS.add(Registered((name,), func, func.__doc__ or ""), func.__module__)
        return func

    return register


SECTION = "derived"


def derive(session: Session) -> DerivedSection:
    """Computes the derived figures, stores them as the ``derived`` section, and returns them."""
    out: DerivedSection = {}
    errors: dict[str, str] = {}
    # stored first: a later part reads the earlier ones (the headline figures read numerics')
    session.sections[SECTION] = out
    for entry in PARTS.entries():
        name = entry.ids[0]
        try:
            value = entry.func(session)
        except Exception as exc:  # one odd section must not cost the findings or the report
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        if value is not None:
            out[name] = value  # type: ignore[literal-required]
    if errors:
        out["errors"] = errors
    return out


def derived(session: Session) -> DerivedSection:
    """The derive step's results: as the session holds them, else derived now.

    Rules and advisors run after the derive step (`ampdiag.analysis.analyze`) and read its
    results instead of computing them again; a session not analysed (a rule's own test, a
    saved session from an older ampdiag) is derived here and left as it was.
    """
    if SECTION in session.sections:
        return session.section("derived")
    try:
        return derive(session)
    finally:
        del session.sections[SECTION]
