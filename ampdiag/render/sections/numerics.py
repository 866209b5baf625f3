"""The numerics section: loss-scale history, log2|g| against FP16's range, per-layer underflow.

Reads the ``gradients``, ``activations`` and ``scaler`` sections; also writes them to
TensorBoard (scalars per step, histograms of log2|g|).
"""

from __future__ import annotations

from typing import Any

from ampdiag import units as humanize
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TABLE_ROWS = 40
#: How each of FP16's limits (log2 exponents, from the derive step) is labelled on the histogram.
LIMIT_LABELS = {
    "flush": "2^{} (flush)",
    "subnormal": "2^{} (subnormal)",
    "overflow": "65504 (overflow)",
}


def _hist_items(hist: dict[str, int]) -> tuple[list[int], list[int]]:
    keys = sorted(int(k) for k in hist)
    return keys, [int(hist[str(k)]) for k in keys]


def _exponents(hist: dict[str, int]) -> dict[int, float]:
    return {int(k): float(v) for k, v in hist.items()}


def build(session: Session) -> ReportSection | None:
    """The numerics section, when any numerics collector wrote something."""
    grads = session.section("gradients")
    acts = session.section("activations")
    sc = session.section("scaler")
    if not grads and not acts and not sc.get("present"):
        return None
    derived = session.section("derived").get("numerics") or {}
    figures: dict[str, str] = {}
    history = sc.get("history") or []
    if history:
        figures["loss-scale"] = svg.data_uri(
            charts.line(
                [h["step"] for h in history],
                {"loss scale": [h["scale"] for h in history]},
                "step",
                "scale",
                "Loss scale per step (dashed: skipped steps)",
                marks=sc.get("skipped_steps") or [],
                logy=True,
            )
        )
    series: dict[str, dict[int, float]] = {}
    if grads.get("hist_held"):
        series["param grads as held (g·S)"] = _exponents(grads["hist_held"])
    if acts.get("exponents"):
        series["activation grads, unscaled"] = _exponents(acts["exponents"])
    if series:
        figures["log2-grad-histogram"] = svg.data_uri(
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
    html = render_template(
        "numerics.html.j2",
        grads=grads,
        acts=acts,
        sc=sc,
        u=u,
        fp16=derived.get("fp16_in_use"),
        modules=modules[:TABLE_ROWS],
        ranged=ranged[:TABLE_ROWS],
        params=sorted(grads.get("params", []), key=lambda p: -p["subnormal_fraction"])[:TABLE_ROWS],
        predictions=[p for p in acts.get("predictions", []) if p["scale_log2"] % 4 == 0],
        figures=figures,
    )
    underflow = f"underflow {humanize.percent(u.get('underflow_fraction'))}"
    # Outside FP16 the figure is what FP16 would do, never this run's problem.
    parts = [underflow if derived.get("fp16_in_use") is not False else f"if FP16: {underflow}"]
    if history:
        parts.append(f"{len(sc.get('skipped_steps') or [])}/{len(history)} steps skipped")
    origin = acts.get("nonfinite_origin")
    if origin:
        parts.append(f"NaN/inf from {origin['module']}")
    return ReportSection(
        id="numerics",
        title="Numerics",
        html=html,
        summary=", ".join(parts),
        figures=list(figures),
    )


def write_tensorboard(session: Session, writer: Any) -> None:
    """Scalars (loss scale, skips, gradient norm and underflow) and log2|g| histograms."""
    import numpy as np

    sc = session.section("scaler")
    for h in sc.get("history") or []:
        writer.add_scalar("numerics/loss_scale", h["scale"], h["step"])
        writer.add_scalar("numerics/skipped", 1.0 if h["skipped"] else 0.0, h["step"])
    grads = session.section("gradients")
    for rec in grads.get("steps", []):
        nz = rec["n"] - rec["zero"] - rec["nonfinite"]
        if isinstance(rec.get("norm"), (int, float)):
            writer.add_scalar("numerics/grad_norm", rec["norm"], rec["step"])
        if nz > 0:
            writer.add_scalar(
                "numerics/grad_subnormal_fraction", rec["subnormal"] / nz, rec["step"]
            )
            writer.add_scalar("numerics/grad_flush_fraction", rec["flush"] / nz, rec["step"])
        writer.add_scalar(
            "numerics/grad_zero_fraction", rec["zero"] / max(1, rec["n"]), rec["step"]
        )
    for tag, hist in (
        ("numerics/log2_grad_held", grads.get("hist_held")),
        ("numerics/log2_grad_true", grads.get("hist_true")),
        ("numerics/log2_activation_grad", session.section("activations").get("exponents")),
    ):
        if not hist:
            continue
        xs, counts = _hist_items(hist)
        values = np.array(xs, dtype=np.float64)
        c = np.array(counts, dtype=np.float64)
        writer.add_histogram_raw(
            tag,
            min=float(values.min()),
            max=float(values.max() + 1),
            num=int(c.sum()),
            sum=float((values * c).sum()),
            sum_squares=float((values * values * c).sum()),
            bucket_limits=(values + 1).tolist(),
            bucket_counts=c.tolist(),
            global_step=0,
        )
    for m in session.section("activations").get("modules", []):
        if "subnormal_fraction" in m:
            writer.add_scalar(
                f"numerics/activation_grad_subnormal/{m['module']}", m["subnormal_fraction"], 0
            )
