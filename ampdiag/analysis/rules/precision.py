"""Findings from the precision audit: how much of the step autocast left in FP32, and why."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ampdiag.analysis import device as D
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.advisors import terms
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.derive import derived
from ampdiag.analysis.divergence import unfixed_by_precision
from ampdiag.analysis.precision import reason_fixes
from ampdiag.analysis.registry import rule
from ampdiag.schema import PrecisionSummary
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Share of the audited step's low-precision + FP32 FLOPs that ran in FP32.
    fp32_flops_share_medium: float = 0.10
    fp32_flops_share_high: float = 0.30
    # Matmul/conv FLOPs (ops with a FLOP formula): below this share run with autocast active,
    # or at least this share run in FP32 -> low precision is not in effect.
    matmul_autocast_share_min: float = 0.50
    matmul_fp32_share_max: float = 0.50


THRESHOLDS = Thresholds()


def _top(summary: PrecisionSummary, n: int = 5) -> list[dict[str, object]]:
    rows = summary["top_fp32"][:n]
    keys = ("op", "module", "reason", "phase", "flops")
    return [{**{k: o[k] for k in keys}, "time_us": round(float(o["time_us"]), 1)} for o in rows]


@rule("fp32-ops-in-autocast")
def fp32_ops_in_autocast(session: Session) -> Iterator[Finding]:
    """With autocast on, >= 10% of FLOPs ran in FP32 (high: >= 30%).

    The FLOP share is counted, so the finding is the same on every identical run. The op time
    share is one audited step's op times, a single sample without a spread (a stalled op moves
    it): it is reported beside the FLOPs, and the precision section shows it, but it raises no
    finding of its own, which would come and go between identical runs on a busy machine.

    Names the top FP32 ops with their module and reason, and gives a fix per reason.
    """
    sec = session.section("precision")
    if not sec.get("audited"):
        return
    if not any(r.get("autocast") for r in sec.get("ops", [])):
        return
    s = derived(session)["precision"]
    fshare, tshare = float(s["fp32_flops_share"]), float(s["fp32_time_share"])
    if fshare < THRESHOLDS.fp32_flops_share_medium:
        return
    severity: Severity = "high" if fshare >= THRESHOLDS.fp32_flops_share_high else "medium"
    top = _top(s)
    reasons = sorted(s["reasons"].items(), key=lambda kv: -kv[1]["time_us"])
    known = reason_fixes(sec)
    flag = terms.sdpa_dropout_setting(session)
    if flag is not None and "sdpa-math-fallback" in known:  # the model built from the CLI
        known["sdpa-math-fallback"] += "\n" + flag
    fixes = [f"[{reason}] {known.get(reason, '')}" for reason, _ in reasons]
    names = ", ".join(f"{o['op']} in {o['module']} ({o['reason']})" for o in top[:3])
    yield Finding(
        id="fp32-ops-in-autocast",
        severity=severity,
        title=(
            f"{fshare:.0%} of the FLOPs and {tshare:.0%} of the op time ran in FP32 under "
            f"autocast: {names}."
        ),
        evidence={
            "fp32_flops_share": round(fshare, 4),
            "fp32_time_share": round(tshare, 4),
            "top_ops": top,
            "reasons": {
                k: {"count": v["count"], "flops": v["flops"], "time_us": round(v["time_us"], 1)}
                for k, v in reasons
            },
            "step": sec.get("step"),
            "thresholds": {"flops_share": THRESHOLDS.fp32_flops_share_medium},
        },
        fix="\n".join(fixes),
        section="precision",
        impact=fshare,
    )


def amp_attempted(session: Session) -> bool:
    """Whether the run tried mixed precision: low-precision autocast or a GradScaler seen.

    Autocast counts wherever it was entered (``autocast_seen``: the state the model's ops ran
    in), and so does any op the precision audit saw run under autocast, or a framework asked
    for mixed precision (``environment.framework_precision``, e.g. Accelerate's fp16 on a
    CPU, which silently trains in FP32).
    """
    if session.environment.get("framework_precision"):
        return True
    run = session.section("run")
    if any(k != "none" for k in run.get("autocast_seen") or {}):
        return True
    if run.get("scaler") is not None or session.section("scaler").get("present"):
        return True
    return bool(session.section("precision").get("autocast_dtypes"))


@rule("low-precision-inactive", "amp-off")
def low_precision_inactive(session: Session) -> Iterator[Finding]:
    """>= 50% of matmul/conv FLOPs ran in FP32 (autocast inactive for them, or overridden).

    Either way the step does not get the low-precision speed-up: ``low-precision-inactive``
    (high) when the run tried mixed precision (autocast or a GradScaler seen), ``amp-off``
    (info) for a deliberate FP32 run, where neither was ever seen. Low, not high, when the run
    diverged or stalled for a reason no precision fixes (`divergence.unfixed_by_precision`),
    and on a CPU that emulates BF16 and FP16 (no AVX512_BF16/AMX) unless the A/B measured one
    faster: there the FP32 the run fell back to is the fast precision, and the fix keeps it.

    Matmuls that ran in low precision without autocast (parameters in bf16, as FSDP2's
    MixedPrecisionPolicy casts them) get the speed-up and do not count.
    """
    sec = session.section("precision")
    if not sec.get("audited"):
        return
    mm = derived(session)["precision"]["matmul"]
    total = mm["low_flops"] + mm["fp32_flops"]
    if total <= 0:
        return
    inactive = mm["autocast_share"] < THRESHOLDS.matmul_autocast_share_min
    fp32 = mm["fp32_share"] >= THRESHOLDS.matmul_fp32_share_max
    # Without autocast, matmuls in low precision are the parameters' own dtype (FSDP2's
    # MixedPrecisionPolicy(param_dtype=bf16), model.to(bf16)): the speed-up is there.
    if not fp32:
        return
    device = sec.get("device_type") or D.device_type(session.environment)
    # the run's own low precision when it set one (advice follows the run's dtype), never
    # one this device cannot run (BF16 below compute capability 8.0)
    run = computes_in(session)["autocast_precision"]
    if run not in ("bf16", "fp16") or not D.advisable(session.environment, run):
        run = "bf16" if device == "cpu" else "fp16"
    if not amp_attempted(session):
        why = pc.measured(session).why_not
        yield Finding(
            id="amp-off",
            severity="info",
            title=(
                "Mixed precision is off: no autocast and no GradScaler were seen, and "
                f"{mm['fp32_share']:.0%} of the matmul FLOPs ran in FP32."
            ),
            evidence={
                "matmul_fp32_share": round(mm["fp32_share"], 4),
                "matmul_fp32_flops": mm["fp32_flops"],
                "step": sec.get("step"),
                "measured": False,
                "not_measured": why,
            },
            fix=terms.precision_fix(session, run, terms.training_step(run, device))
            + "\n# If FP32 is not deliberate. ampdiag.compare(model, batch, loss_fn) times FP32,"
            "\n# BF16 and FP16 on this model and says which is fastest and safe.",
            section="precision",
            impact=0.0,
        )
        return
    if inactive:
        title = (
            f"Autocast was not active for {1 - mm['autocast_share']:.0%} of the matmul FLOPs: "
            "they ran in the parameters' dtype."
        )
    else:
        title = f"{mm['fp32_share']:.0%} of the matmul FLOPs ran in FP32 despite autocast."
    why, fix = terms.inactive_autocast(session, device, run)
    if not why:
        fix += "\n# and no enclosing autocast(enabled=False), and no .float(), around the matmuls"
    if why:
        title = f"{why} ({1 - mm['autocast_share']:.0%} of the matmul FLOPs ran without autocast)."
    # the FP32 the run fell back to is the fast precision on such a CPU (nanoGPT's train.py
    # on a CPU keeps a CUDA GradScaler): a low-precision fix would cost it several times
    fast = pc.fp32_fast_here(session, device)
    emulated = fast is not None
    if fast is not None:
        title = title.rstrip(".") + f"; FP32 is the fast precision here ({fast})."
        fix = f"# Keep FP32 here ({fast}). Say so:\n" + terms.precision_fix(
            session, "fp32", terms.training_step("fp32", device)
        )
        if session.environment.get("bf16_native") is False:  # where it would pay
            fix += "\n# Mixed precision pays on a CPU with AVX512_BF16/AMX, or on a GPU" + (
                ": on a CPU, torch.autocast(device_type='cpu', dtype=torch.bfloat16), not "
                "torch.cuda.amp.autocast()"
                if terms.cuda_amp_on_cpu(session)
                else "."
            )
    # a run that diverges whatever its precision: its divergence is the fix to make first
    later = unfixed_by_precision(session)
    if later:
        title = title.rstrip(".") + " (after the divergence, which no precision fixes)."
    yield Finding(
        id="low-precision-inactive",
        severity="low" if later or emulated else "high",
        title=title,
        evidence={
            "matmul_autocast_share": round(mm["autocast_share"], 4),
            "matmul_fp32_share": round(mm["fp32_share"], 4),
            "matmul_fp32_flops": mm["fp32_flops"],
            "matmul_low_flops": mm["low_flops"],
            "step": sec.get("step"),
            "thresholds": {
                "autocast_share_min": THRESHOLDS.matmul_autocast_share_min,
                "fp32_share_max": THRESHOLDS.matmul_fp32_share_max,
            },
        },
        fix=fix,
        section="precision",
        impact=max(1 - mm["autocast_share"], mm["fp32_share"]),
    )
