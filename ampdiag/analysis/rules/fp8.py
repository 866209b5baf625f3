"""FP8 readiness: which Linear layers can train in FP8, from the precision A/B's FP8 rows.

The per-layer verdicts are the derived ones (`analysis.fp8`: the A/B's, with the amax
movement over the sampled steps); their thresholds (`sources.live.fp8.THRESHOLDS` and
`analysis.fp8.THRESHOLDS`) are recorded beside them. This rule only turns them into one
finding with the filter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session

# No thresholds of its own: the verdicts' are in the section (``fp8.thresholds``).


@rule("fp8-readiness")
def fp8_readiness(session: Session) -> Iterator[Finding]:
    """Which layers to convert to FP8 and which to keep in BF16, with the recipe and filter."""
    fp8 = session.section("derived").get("fp8")
    if fp8 is None or not fp8.get("layers"):
        return
    layers = [la for la in fp8["layers"] if isinstance(la, Mapping)]
    convert, keep = list(fp8.get("convert") or []), list(fp8.get("keep") or [])
    title = (
        f"FP8 ({fp8.get('recipe')} scaling): {len(convert)} of {len(layers)} Linear layers are "
        f"FP8-safe on this batch"
        + (f"; keep {', '.join(keep[:5])}{' …' if len(keep) > 5 else ''} in BF16." if keep
           else ".")
    )  # fmt: skip
    yield Finding(
        id="fp8-readiness",
        severity="info",
        title=title,
        evidence={
            "recipe": fp8.get("recipe"),
            "convert": convert,
            "keep": {str(la["name"]): la.get("reasons") for la in layers if la["name"] in keep},
            **{k: fp8.get(k) for k in ("loss_rel_diff_vs_bf16", "speedup", "speed", "thresholds")},
            "amax_drift": {
                str(la["name"]): la.get("amax_drift") for la in layers if la.get("amax_drift")
            }
            or fp8.get("amax_drift"),
        },
        fix=str(fp8.get("filter", "")),
        section="precision",
        impact=0.0,
    )
