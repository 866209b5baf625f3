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
from typing import Any

from ampdiag.analysis import (
    divergence,
    figures,
    fp8,
    fp16range,
    memory_estimates,
    numerics,
    precision,
)
from ampdiag.schema import (
    DerivedSection,
    Fp8Readiness,
    MemoryWhatIf,
    NumericsDerived,
    PrecisionSummary,
)
from ampdiag.session import Session

SECTION = "derived"


def derive(session: Session) -> DerivedSection:
    """Computes the derived figures, stores them as the ``derived`` section, and returns them."""
    out: DerivedSection = {}
    errors: dict[str, str] = {}
    # stored first: a later part reads the earlier ones (the headline figures read numerics')
    session.sections[SECTION] = out
    for name, part in PARTS.items():
        try:
            value = part(session)
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


def _precision(session: Session) -> PrecisionSummary | None:
    audit = session.section("precision")
    if not audit.get("audited"):
        return None
    summary = precision.summarize(audit)
    fixes = precision.reason_fixes(audit)
    summary["reason_fixes"] = {r: fixes[r] for r in summary["reasons"] if r in fixes}
    return summary


def _memory(session: Session) -> MemoryWhatIf | None:
    memory = session.section("memory")
    return memory_estimates.whatif(memory) if memory else None


def _numerics(session: Session) -> NumericsDerived | None:
    seen = session.section("gradients") or session.section("activations")
    if not seen and not session.section("scaler").get("present"):
        return None
    return {
        "fp16_in_use": numerics.fp16_in_use(session),
        "underflow": numerics.underflow_summary(session),
        "fp16_limits_log2": {
            "flush": fp16range.FP16_MIN_SUBNORMAL_LOG2,
            "subnormal": fp16range.FP16_MIN_NORMAL_LOG2,
            "overflow": fp16range.FP16_OVERFLOW_LOG2,
        },
    }


def _fp8(session: Session) -> Fp8Readiness | None:
    ab = session.section("speed_probe").get("precisions")
    row = ab.get("fp8") if isinstance(ab, dict) else None
    if not isinstance(row, dict):
        return None
    return fp8.readiness(row, session.section("fp8_amax"))


#: Part name -> what computes it (None when the session has no input for it).
PARTS: dict[str, Callable[[Session], Mapping[str, Any] | None]] = {
    "precision": _precision,
    "memory": _memory,
    "numerics": _numerics,
    "divergence": divergence.assess,
    "fp8": _fp8,
    "figures": figures.compute,  # last: it reads the parts above
}
