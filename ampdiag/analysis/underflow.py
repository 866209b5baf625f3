"""What FP16 does to this run's numbers: whether it computes in FP16, and the underflow measured.

Shared by the numerics rules (thresholds on these figures) and the derive step (the report
shows them), so both read one computation.
"""

from __future__ import annotations

from typing import Any

from ampdiag.analysis import fp16range
from ampdiag.session import Session


def fp16_in_use(session: Session) -> bool:
    """Whether the run computed in FP16: fp16 autocast seen, or fp16 parameters."""
    run = session.section("run")
    autocast = run.get("autocast_seen") or {}
    if any(str(k).endswith(":float16") for k in autocast):
        return True
    if session.section("scaler").get("fp16_params"):
        return True
    return any("float16" in (m.get("param_dtypes") or []) for m in run.get("models") or [])


def underflow_summary(session: Session) -> dict[str, Any]:
    """The measured underflow figures (activation gradients and parameter gradients)."""
    acts = session.section("activations")
    grads = session.section("gradients")
    act_nz = act_sub = act_flush = 0
    worst: tuple[float, str] = (0.0, "")
    for m in acts.get("modules", []):
        c = m.get("counts")
        if not c:
            continue
        nz = c["n"] - c["zero"] - c["nonfinite"]
        act_nz += nz
        act_sub += c["subnormal"]
        act_flush += c["flush"]
        if nz > 0 and m["subnormal_fraction"] > worst[0]:
            worst = (m["subnormal_fraction"], m["module"])
    totals = grads.get("totals", {})
    act_fraction = act_sub / act_nz if act_nz else 0.0
    grad_fraction = float(totals.get("subnormal_fraction", 0.0))
    rec = acts.get("recommended_init_scale")
    if rec is None and grads.get("hist_true"):
        k = fp16range.recommend_scale_log2({int(e): c for e, c in grads["hist_true"].items()})
        rec = float(2**k) if k is not None else None
    return {
        "underflow_fraction": round(max(act_fraction, grad_fraction), 6),
        "activation_grad_subnormal_fraction": round(act_fraction, 6),
        "activation_grad_flush_fraction": round(act_flush / act_nz if act_nz else 0.0, 6),
        "param_grad_subnormal_fraction": round(grad_fraction, 6),
        "param_grad_flush_fraction": round(float(totals.get("flush_fraction", 0.0)), 6),
        "param_grad_zero_fraction": round(float(totals.get("zero_fraction", 0.0)), 6),
        "worst_module": worst[1] or None,
        "worst_module_fraction": round(worst[0], 6),
        "recommended_init_scale": rec,
        "measured": bool(act_nz or totals.get("n")),
    }
