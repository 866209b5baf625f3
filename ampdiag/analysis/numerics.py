"""The numerics figures derived from the collected sections, for the rules and the reports.

The measured FP16 underflow (`underflow_summary`): the derive step stores it as
``derived.numerics``, the headline figures and the rules read the same one. A figure, not a
judgement: the thresholds that turn it into a finding are the rules'
(`ampdiag.analysis.rules.numerics`).
"""

from __future__ import annotations

from ampdiag.analysis import fp16range
from ampdiag.analysis.derive import part
from ampdiag.schema import NumericsDerived, UnderflowSummary
from ampdiag.session import Session

#: Modules named in the underflow evidence, largest share first.
TOP_MODULES = 10


def underflow_summary(session: Session) -> UnderflowSummary:
    """The measured underflow figures (each defined in docs/how-it-works.md, "Numerics").

    ``underflow_fraction`` is the largest of three shares counted against the higher-precision
    value, so values FP16 flushed to zero count: at the autocast boundary, inside the model
    against the FP32 replay's true gradients, and of the parameter gradients FP16 held. Where no
    replay gave an FP32 truth, FP16's own values understate what it flushed: those figures and
    the scale are None, and ``unmeasured`` says why.
    """
    acts = session.section("activations")
    grads = session.section("gradients")
    act_nz = act_sub = act_flush = 0
    worst: tuple[float, str] = (0.0, "")
    per_module: list[tuple[float, str]] = []
    replay = acts.get("replay")
    for m in acts.get("modules", []):
        if replay:  # against the true values: what FP16 flushed to zero counts
            t = m.get("true_counts")
            if not t:
                continue
            nz, sub, flush, frac = t["nonzero"], t["lost"], t["flush"], m["lost_fraction"]
        else:
            c = m.get("counts")
            if not c:
                continue
            nz = c["n"] - c["zero"] - c["nonfinite"]
            sub, flush, frac = c["subnormal"], c["flush"], m["subnormal_fraction"]
        act_nz += nz
        act_sub += sub
        act_flush += flush
        if nz > 0:
            per_module.append((frac, m["module"]))
        if nz > 0 and frac > worst[0]:
            worst = (frac, m["module"])
    boundary = acts.get("boundary") or {}
    bnd_fraction = float(boundary.get("lost_fraction", 0.0))
    # Only the parameter gradients FP16 held (autocast computes some in FP32).
    totals = grads.get("totals", {})
    totals = totals.get("fp16_computed") or totals
    act_fraction = act_sub / act_nz if act_nz else 0.0
    grad_fraction = float(totals.get("subnormal_fraction", 0.0))
    rec = acts.get("recommended_init_scale")
    reached = acts.get("scale_reaches_target", True)
    if rec is None and grads.get("hist_true"):
        k, reached = fp16range.search_scale_log2({int(e): c for e, c in grads["hist_true"].items()})
        rec = float(2**k) if k is not None else None
    failed = acts.get("replay_failed") if not replay else None
    unmeasured: dict[str, str] = {}
    if failed:
        why = f"the FP32 replay gave no true gradients: {failed.get('reason')}"
        unmeasured = dict.fromkeys(
            ("activation_grad_subnormal_fraction", "recommended_init_scale"), why
        )
        act_fraction, per_module, worst, rec = 0.0, [], (0.0, ""), None
    act_flush_fraction = round(act_flush / act_nz if act_nz else 0.0, 6)
    summary: UnderflowSummary = {
        "underflow_fraction": round(max(bnd_fraction, act_fraction, grad_fraction), 6),
        "boundary_lost_fraction": round(bnd_fraction, 6),
        "activation_grad_subnormal_fraction": None if failed else round(act_fraction, 6),
        "activation_grad_flush_fraction": None if failed else act_flush_fraction,
        "param_grad_subnormal_fraction": round(grad_fraction, 6),
        "param_grad_flush_fraction": round(float(totals.get("flush_fraction", 0.0)), 6),
        "param_grad_zero_fraction": round(float(totals.get("zero_fraction", 0.0)), 6),
        "worst_module": worst[1] or None,
        "worst_module_fraction": None if failed else round(worst[0], 6),
        # the modules that lose the largest shares (at most TOP_MODULES)
        "module_lost_fraction": {
            name: round(frac, 4)
            for frac, name in sorted(per_module, key=lambda x: -x[0])[:TOP_MODULES]
            if frac > 0
        },
        "recommended_init_scale": rec,
        "recommended_at_step": acts.get("recommended_at_step"),
        "scale_reaches_target": bool(reached) if rec is not None else None,
        "measured": bool(act_nz or totals.get("n") or boundary.get("counts", {}).get("n")),
    }
    if unmeasured:
        summary["unmeasured"] = unmeasured
    return summary


@part("numerics")
def derived_numerics(session: Session) -> NumericsDerived | None:
    """The underflow summary and FP16's limits (derived part)."""
    seen = session.section("gradients") or session.section("activations")
    if not seen and not session.section("scaler").get("present"):
        return None
    return {
        "underflow": underflow_summary(session),
        "fp16_limits_log2": {
            "flush": fp16range.FP16_MIN_SUBNORMAL_LOG2,
            "subnormal": fp16range.FP16_MIN_NORMAL_LOG2,
            "overflow": fp16range.FP16_OVERFLOW_LOG2,
        },
    }
