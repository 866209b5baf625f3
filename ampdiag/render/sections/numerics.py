"""The numerics section: log2|g| against FP16's range, per-layer underflow.

The loss scale over the steps is the GradScaler section's. Reads the ``gradients``,
``activations`` and ``scaler`` sections; also writes them to TensorBoard (scalars per step,
histograms of log2|g|).
"""

from __future__ import annotations

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, stated, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
from ampdiag.schema import NumericsDerived
from ampdiag.session import Session

TITLE = "Numerics"
NEEDS = "gradient and activation statistics of sampled steps"

TABLE_ROWS = 40
#: How each of FP16's limits (log2 exponents, from the derive step) is labelled on the histogram.
LIMIT_LABELS = {
    "flush": "2^{} (flush)",
    "subnormal": "2^{} (subnormal)",
    "overflow": "65504 (overflow)",
}


def _exponents(hist: dict[str, int]) -> dict[int, float]:
    return {int(k): float(v) for k, v in hist.items()}


def first_nonfinite(session: Session) -> dict[str, object] | None:
    """Where inf/NaN first appeared, as the ``nonfinite-origin`` finding states it (or None).

    The finding's origin is the analysis' one answer (the every-step sentinel's, else the
    sampled collector's): the table states the same step and module, never the collector's
    own sampled origin beside a different one in the finding.
    """
    for f in session.all_findings():
        if f.id == "nonfinite-origin" and isinstance(f.evidence.get("step"), int):
            return dict(f.evidence)
    return None


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The numerics section, when any numerics collector wrote something."""
    grads = session.section("gradients")
    acts = session.section("activations")
    sc = session.section("scaler")
    if not grads and not acts and not sc.get("present"):
        return None
    derived: NumericsDerived = session.section("derived").get("numerics") or {}
    figures: dict[str, Markup] = {}
    history = sc.get("history") or []
    series: dict[str, dict[int, float]] = {}
    if grads.get("hist_held"):
        series["param grads as held (g·S)"] = _exponents(grads["hist_held"])
    if acts.get("exponents"):
        series["activation grads, unscaled"] = _exponents(acts["exponents"])
    if series:
        figures["log2-grad-histogram"] = svg.inline(
            charts.histogram(
                series,
                "log2 |value|",
                "values",
                "log2 |gradient| against FP16's range",
                limits=[
                    (float(x), LIMIT_LABELS.get(k, k).format(x))
                    for k, x in (derived.get("fp16_limits_log2") or {}).items()
                ],
            )
        )
    modules = [m for m in acts.get("modules", []) if m.get("counts")]
    modules.sort(key=lambda m: -float(m.get("subnormal_fraction", 0.0)))
    ranged = [m for m in acts.get("modules", []) if "max_abs" in m]
    ranged.sort(key=lambda m: -float(m["max_abs"]) if m["max_abs"] == m["max_abs"] else 0.0)
    u = derived.get("underflow") or {}
    skipped = stated.figures(session).get("skipped_steps")
    html = render_template(
        "numerics.html.j2",
        grads=grads,
        acts=acts,
        sc=sc,
        u=u,
        skipped=skipped,
        origin=first_nonfinite(session),
        fp16=derived.get("fp16_in_use"),
        modules=modules[:TABLE_ROWS],
        ranged=ranged[:TABLE_ROWS],
        params=sorted(grads.get("params", []), key=lambda p: -p["subnormal_fraction"])[:TABLE_ROWS],
        predictions=[p for p in acts.get("predictions", []) if p["scale_log2"] % 4 == 0],
        figures=figures,
    )
    underflow = f"underflow {humanize.percent(u.get('underflow_fraction'))}"
    # Outside FP16 the figure is what FP16 would do, never this run's problem.
    parts = [
        underflow
        if derived.get("fp16_in_use") is not False
        else f"if this run used FP16 without loss scaling: {underflow}"
    ]
    if history and skipped:
        parts.append(f"{skipped['skipped']}/{skipped['steps']} steps skipped")
    origin = first_nonfinite(session)
    if origin:
        parts.append(f"NaN/inf from {origin['module']} at step {origin['step']}")
    return ReportSection(
        id="numerics",
        title=TITLE,
        html=html,
        summary=", ".join(parts),
        figures=list(figures),
    )
