"""The numerics section: log2|g| against FP16's range, per-layer underflow.

The loss scale over the steps is the GradScaler section's. Reads the ``gradients``,
``activations`` and ``scaler`` sections; also writes them to TensorBoard (scalars per step,
histograms of log2|g|).
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, stated, svg, templating
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import join, table
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
    compute = stated.compute(session)
    fp16 = compute["precision"] == "fp16" if compute else None
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
    html = join(
        (
            _summary(u, sc, skipped, first_nonfinite(session), fp16),
            templating.figures(figures),
            _predictions([p for p in acts.get("predictions", []) if p["scale_log2"] % 4 == 0]),
            _modules(modules[:TABLE_ROWS]),
            _ranged(ranged[:TABLE_ROWS]),
            _params(
                sorted(grads.get("params", []), key=lambda p: -p["subnormal_fraction"])[
                    :TABLE_ROWS
                ],
                grads,
            ),
            _clipping(sc),
        )
    )
    underflow = f"underflow {humanize.percent(u.get('underflow_fraction'))}"
    # Outside FP16 the figure is what FP16 would do, never this run's problem.
    parts = [
        underflow
        if fp16 is not False
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


def _summary(u: Any, sc: Any, skipped: Any, origin: Any, fp16: bool | None) -> Markup:
    """FP16's range, whether the run computes in it, and the underflow figures against it."""
    pct = humanize.percent
    if fp16 is None:
        said: Any = (
            "Whether this run computes in FP16 was not derived (the session was not analysed)."
        )
    elif fp16:
        said = "This run computes in FP16."
    else:
        said = Markup(
            "This run does not compute in FP16: the figures predict what it would lose if it used "
            "FP16 without loss scaling{}."
        ).format(
            Markup(
                " (a GradScaler at the recommended <code>init_scale</code> would keep all but 1% "
                "of it)"
            )
            if u.get("recommended_init_scale")
            else ""
        )
    out = [
        Markup(
            "<p>FP16 holds |x| from 2<sup>-24</sup> ≈ 0.00000006 (below: flushed to zero) to "
            "65504; below 2<sup>-14</sup> it is subnormal and loses precision.\n{}</p>\n"
            '<table class="evidence"><tbody>\n'
            "<tr><th>{}nonzero gradient values below 2<sup>-14</sup> (zero or subnormal in FP16)"
            '</th><td class="num">{}</td></tr>\n'
            "<tr><th>activation gradients flushed (&lt; 2<sup>-24</sup>) / subnormal</th>"
            '<td class="num">{} / {}</td></tr>\n'
            "<tr><th>parameter gradients zero / flushed / subnormal</th>"
            '<td class="num">{} / {} / {}</td></tr>\n'
        ).format(
            said,
            "if this run used FP16 without loss scaling: " if fp16 is False else "",
            pct(u.get("underflow_fraction")),
            pct(u.get("activation_grad_flush_fraction")),
            pct(u.get("activation_grad_subnormal_fraction")),
            pct(u.get("param_grad_zero_fraction")),
            pct(u.get("param_grad_flush_fraction")),
            pct(u.get("param_grad_subnormal_fraction")),
        )
    ]
    if u.get("recommended_init_scale"):
        out.append(
            Markup(
                "<tr><th>{}recommended <code>init_scale</code> (underflow &lt; 1%, no overflow)"
                '</th><td class="num">{}</td></tr>'
            ).format(
                "" if fp16 else "if this run used FP16: ",
                humanize.count(u["recommended_init_scale"]),
            )
        )
    if sc.get("present"):
        scaler = sc["scaler"]
        out.append(
            Markup(
                "<tr><th>GradScaler</th><td>{}; skipped {} of {} steps; growth {}, backoff {}"
                "</td></tr>"
            ).format(
                "enabled" if scaler and scaler["enabled"] else "disabled",
                humanize.count(skipped["skipped"]) if skipped else len(sc["skipped_steps"] or []),
                humanize.count(skipped["steps"]) if skipped else len(sc["history"] or []),
                sc.get("growth_total", len(sc.get("growth_steps") or [])),
                sc.get("backoff_total", len(sc.get("backoff_steps") or [])),
            )
        )
    if origin:
        out.append(
            Markup("<tr><th>first inf/NaN</th><td>step {}, {} of <code>{}</code></td></tr>").format(
                origin["step"], origin["kind"], origin["module"]
            )
        )
    out.append(Markup("</tbody></table>\n"))
    return join(out)


_FRACTIONS = ("zero_fraction", "flush_fraction", "subnormal_fraction")


def _predictions(predictions: list[Any]) -> Markup:
    if not predictions:
        return Markup("")
    pct = humanize.percent
    cells = (
        [Markup("2<sup>{}</sup>").format(p["scale_log2"])]
        + [pct(p[k]) for k in ("flush", "subnormal", "overflow")]
        for p in predictions
    )
    head = ("scale", "#flushed", "#zero or subnormal", "#overflow")
    return Markup(
        "<h3>Predicted activation-gradient loss at candidate loss scales</h3>\n{}"
    ).format(table(head, "tnnn", cells))


def _modules(modules: list[Any]) -> Markup:
    if not modules:
        return Markup("")
    pct = humanize.percent
    scale = Markup("2<sup>{}</sup>")
    cells = (
        [m["module"], m["grad_dtype"], humanize.count(m["counts"]["n"])]
        + [pct(m[k]) for k in (*_FRACTIONS, "overflow_fraction")]
        + ["" if m["recommended_scale_log2"] is None else scale.format(m["recommended_scale_log2"])]
        for m in modules
    )
    head = ("module", "grad dtype", "#values", "#zero", "#flushed", "#subnormal", "#overflow")
    return Markup(
        "<h3>Per-layer underflow (gradient entering each module, at the scale in use)</h3>\n{}"
    ).format(table((*head, "#scale to keep < 1%"), "ctnnnnnn", cells))


def _ranged(ranged: list[Any]) -> Markup:
    if not ranged:
        return Markup("")
    cells = (
        (
            m["module"],
            m["output_dtype"],
            humanize.count(m["max_abs"]),
            humanize.percent(m["max_abs"] / 65504),
        )
        for m in ranged
    )
    head = ("module", "output dtype", "#max |x|", "#share of 65504")
    return Markup(
        '<details class="more"><summary>Forward range (|output| max against 65504)</summary>\n'
        "{}</details>\n"
    ).format(table(head, "ctnn", cells))


def _params(params: list[Any], grads: Any) -> Markup:
    if not params:
        return Markup("")
    num = humanize.count
    cells = (
        [
            p["name"],
            num(p["n"]),
            *(humanize.percent(p[k]) for k in _FRACTIONS),
            num(p["nonfinite"]),
            num(p["norm_last"]),
        ]
        for p in params
    )
    head = ("parameter", "#values", "#zero", "#flushed", "#subnormal", "#non-finite", "#last norm")
    return Markup(
        '<details class="more"><summary>Parameter gradients (summed over {} sampled steps)'
        "</summary>\n{}</details>\n"
    ).format(len(grads["steps"]), table(head, "cnnnnnn", cells))


def _clipping(sc: Any) -> Markup:
    if not sc.get("clip_events"):
        return Markup("")
    event = Markup("step {} ({}, limit {}, {})")
    events = Markup("; ").join(
        event.format(
            e["step"],
            e["function"],
            e["limit"],
            "on scaled gradients" if e["grads_scaled"] else "after unscale_",
        )
        for e in sc["clip_events"][:5]
    )
    return Markup("<p>Gradient clipping: {}.</p>").format(events)
