"""The numerics section: loss-scale history, log2|g| against FP16's range, per-layer underflow.

Reads the ``gradients``, ``activations`` and ``scaler`` sections; also writes them to
TensorBoard (scalars per step, histograms of log2|g|).
"""

from __future__ import annotations

from typing import Any

from ampdiag.analysis import fp16range
from ampdiag.render import plots
from ampdiag.render.sections import ReportSection
from ampdiag.render.templating import render_template
from ampdiag.session import Session

TABLE_ROWS = 40


def _hist_items(hist: dict[str, int]) -> tuple[list[int], list[int]]:
    keys = sorted(int(k) for k in hist)
    return keys, [int(hist[str(k)]) for k in keys]


@plots.memoized
def histogram_png(series: dict[str, dict[str, int]], title: str) -> bytes:
    """Bars of value counts per log2 exponent, with FP16's limits marked."""
    plt = plots._pyplot()
    fig, ax = plt.subplots(figsize=(7, 3))
    width = 0.8 / max(1, len(series))
    for i, (name, hist) in enumerate(series.items()):
        xs, ys = _hist_items(hist)
        ax.bar([x + i * width for x in xs], ys, width=width, label=name, align="edge")
    for x, label, color in (
        (fp16range.FP16_MIN_SUBNORMAL_LOG2, "2^-24 (flush)", "tab:red"),
        (fp16range.FP16_MIN_NORMAL_LOG2, "2^-14 (subnormal)", "tab:orange"),
        (fp16range.FP16_OVERFLOW_LOG2, "65504 (overflow)", "tab:red"),
    ):
        ax.axvline(x, color=color, linestyle="--", alpha=0.7)
        ax.text(x, ax.get_ylim()[1] * 0.95, label, rotation=90, va="top", fontsize=7)
    ax.set_xlabel("log2 |value|")
    ax.set_ylabel("values")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return plots.figure_png(fig)


def build(session: Session) -> ReportSection | None:
    """The numerics section, when any numerics collector wrote something."""
    from ampdiag.analysis.rules.numerics import fp16_in_use, underflow_summary

    grads = session.section("gradients")
    acts = session.section("activations")
    sc = session.section("scaler")
    if not grads and not acts and not sc.get("present"):
        return None
    figures: dict[str, str] = {}
    history = sc.get("history") or []
    if history:
        figures["loss-scale"] = plots.data_uri(
            plots.line(
                [h["step"] for h in history],
                {"loss scale": [h["scale"] for h in history]},
                "step",
                "scale",
                "Loss scale per step (dashed: skipped steps)",
                marks=sc.get("skipped_steps") or [],
                logy=True,
            )
        )
    series: dict[str, dict[str, int]] = {}
    if grads.get("hist_held"):
        series["param grads as held (g·S)"] = grads["hist_held"]
    if acts.get("exponents"):
        series["activation grads, unscaled"] = acts["exponents"]
    if series:
        figures["log2-grad-histogram"] = plots.data_uri(
            histogram_png(series, "log2 |gradient| against FP16's range")
        )
    modules = [m for m in acts.get("modules", []) if m.get("counts")]
    modules.sort(key=lambda m: -float(m.get("subnormal_fraction", 0.0)))
    ranged = [m for m in acts.get("modules", []) if "max_abs" in m]
    ranged.sort(key=lambda m: -float(m["max_abs"]) if m["max_abs"] == m["max_abs"] else 0.0)
    u = underflow_summary(session)
    html = render_template(
        "numerics.html.j2",
        grads=grads,
        acts=acts,
        sc=sc,
        u=u,
        fp16=fp16_in_use(session),
        modules=modules[:TABLE_ROWS],
        ranged=ranged[:TABLE_ROWS],
        params=sorted(grads.get("params", []), key=lambda p: -p["subnormal_fraction"])[:TABLE_ROWS],
        predictions=[p for p in acts.get("predictions", []) if p["scale_log2"] % 4 == 0],
        figures=figures,
    )
    parts = [f"underflow {u['underflow_fraction']:.1%}"]
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
