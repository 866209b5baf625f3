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
    """The measured underflow figures.

    ``underflow_fraction`` is the largest of: the share of nonzero FP32 gradient values that
    FP16 held as zero or subnormal where the backward cast them to FP16 (the autocast
    boundary: counted against the FP32 value, so values flushed to zero count); the same
    share of the gradients entering every module (``activation_grad_subnormal_fraction``),
    counted against their true values from the FP32 replay of each sampled step where it ran
    (else over the nonzero FP16 values, which cannot show what flushed to zero); and the
    zero-or-subnormal share of the nonzero parameter gradients FP16 held (under autocast,
    those of the parameters it cast: ``gradients.totals.fp16_computed``). ``worst_module`` is the
    module with the largest such share.
    ``recommended_init_scale``: the smallest power of two that keeps the predicted share
    under 1% without overflow, searched up to 2^120 -- from the replays, the largest over
    the sampled steps (``recommended_at_step``); ``scale_reaches_target`` False when no
    scale does (the gradients span more than FP16's range).
    Where replays ran but none gave an FP32 truth (``activations.replay_failed``: the model
    computes in low precision outside autocast, the replay's output was not the step's...),
    FP16's values understate what it flushed: the activation-gradient figures and the scale
    are None, and ``unmeasured`` names them with the reason.
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
