"""Low-precision weights: parameters stored in BF16/FP16 that an optimizer updates.

One finding, ``low-precision-params``, for one concept: the optimizer updates the weights in
their own 16-bit dtype instead of FP32 master weights, so an update smaller than half the
weight's spacing is lost (BF16 keeps 8 significant bits, FP16 11). It rests on the
``weight_updates`` section (`ampdiag.sources.live.collectors.weight_updates`): the share of
sampled values with a nonzero gradient that the optimizer step left bit-for-bit unchanged.
Sessions without that section (older ones) fall back on the FP16 parameters the scaler
section lists and the models' parameter dtypes, unmeasured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ampdiag.analysis import device as D
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.advisors import terms
from ampdiag.analysis.derive import derived
from ampdiag.analysis.registry import rule
from ampdiag.schema import DivergenceResult
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Share of sampled updates (values with a nonzero gradient) the step left unchanged.
    unchanged_medium: float = 0.05
    unchanged_high: float = 0.25


THRESHOLDS = Thresholds()

SECTION = "numerics"
NAMES = {"bfloat16": "BF16", "float16": "FP16"}
#: torch.optim's optimizers: the fix rebuilds the run's own (named ``torch.optim.<Name>``).
TORCH_OPTIMIZERS = frozenset(
    {"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam", "RAdam",
     "RMSprop", "Rprop", "LBFGS", "SparseAdam", "Adafactor"}
)  # fmt: skip


def _measured(session: Session) -> dict[str, Any] | None:
    """The ``weight_updates`` figures where some optimizer updates BF16/FP16 parameters."""
    sec = session.section("weight_updates")
    optimizers = [
        o
        for o in sec.get("optimizers") or []
        if int(o.get("low_precision_params") or 0) > int(o.get("master_params") or 0)
    ]
    if not optimizers:
        return None  # none, or every one updated through an FP32 master copy
    dtypes: dict[str, int] = {}
    for o in optimizers:
        for k, v in (o.get("dtypes") or {}).items():
            dtypes[k] = dtypes.get(k, 0) + int(v)
    params = sec.get("params") or []
    steps = [s for s in sec.get("steps") or [] if s.get("unchanged_share") is not None]
    out: dict[str, Any] = {
        "low_precision_params": sum(int(o["low_precision_params"]) for o in optimizers),
        "low_precision_numel": sum(int(o.get("low_precision_numel") or 0) for o in optimizers),
        "dtypes": dtypes,
        "optimizers": sorted({str(o.get("optimizer")) for o in optimizers}),
        "lr": sorted({lr for o in optimizers for lr in o.get("lr") or []}),
        "examples": [x for o in optimizers for x in o.get("examples") or []][:5],
        "master_params": sum(int(o.get("master_params") or 0) for o in optimizers),
        "unchanged_share": sec.get("unchanged_share"),
        "steps_measured": sec.get("steps_measured", 0),
        "elements_measured": sec.get("elements", 0),
    }
    if steps:
        worst = max(steps, key=lambda s: float(s["unchanged_share"]))
        out["worst_step"] = worst["step"]
        out["worst_step_unchanged_share"] = worst["unchanged_share"]
    if params:
        out["worst_param"] = params[0].get("name")
        out["worst_param_unchanged_share"] = params[0].get("unchanged_share")
    return out


def _fallback(session: Session) -> dict[str, Any] | None:
    """An older session's FP16 parameters (scaler section, model dtypes): not measured."""
    found = session.section("scaler").get("fp16_params") or []
    models = [
        m
        for m in session.section("run").get("models") or []
        if "float16" in (m.get("param_dtypes") or [])
    ]
    if not found and not models:
        return None
    count = sum(int(f["fp16_params"]) for f in found)
    return {
        "low_precision_params": count,
        "low_precision_numel": sum(int(f["fp16_numel"]) for f in found),
        "dtypes": {"float16": count},
        "optimizers": sorted({str(f.get("optimizer")) for f in found}),
        "examples": [x for f in found for x in f.get("examples", [])][:5],
        "models_with_fp16": [m.get("class") for m in models],
        "unchanged_share": None,
        "steps_measured": 0,
    }


def fix_code(
    environment: Mapping[str, Any],
    stored: str,
    lr: Any = None,
    optimizer: str | None = None,
    measured: str | None = None,
) -> str:
    """FP32 master weights, computing in the precision the run should train in, as code.

    ``stored`` is the weights' dtype ("bfloat16" or "float16"); ``measured`` the precision the
    precision A/B measured the fastest safe ("fp32", "tf32", "bf16", "fp16"; None when it
    measured none). The computation is that precision where there is one (one precision
    advice: the same as ``prefer-*``'s), else BF16 where the device runs it, else autocast
    in the stored dtype where the device
    runs it: BF16 needs compute capability 8.0 on a GPU (`device.advisable`), so a GPU below is
    given FP16 with a GradScaler instead, and no advice to keep BF16 weights.
    """
    dev = D.device_type(environment)
    dtype = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
        measured or "", stored
    )
    if measured is None and dtype == "float16" and D.advisable(environment, "bf16"):
        # nothing measured: BF16 where the device runs it -- its range needs no GradScaler
        # (prefer-bf16's basis; one precision advice)
        dtype = "bfloat16"
    if dtype == "bfloat16" and not D.advisable(environment, "bf16"):
        dtype = "float16"
    keep = dtype == stored  # the stored dtype is one to compute in on this device
    lr_txt = f"{lr:g}" if isinstance(lr, (int, float)) else "..."
    name = optimizer or "AdamW"
    make = f"torch.optim.{name}" if name in TORCH_OPTIMIZERS else name
    lines = [
        "Keep FP32 weights for the optimizer"
        + (
            " and train in FP32 (the precision A/B measured it the fastest safe):"
            if dtype == "float32"
            else f" and let autocast compute in {NAMES.get(dtype, dtype)}:"
        ),
        "model = model.float()   # FP32 parameters, "
        + (f"instead of model.to(torch.{stored})" if keep else "instead of 16-bit ones"),
        f"optimizer = {make}(model.parameters(), lr={lr_txt})   # made after it",
    ]
    if dtype in ("float16", "bfloat16"):
        lines.append(terms.training_step(NAMES[dtype].lower(), dev))
    else:
        lines += ["loss = loss_fn(model(x), y)", "loss.backward()", "optimizer.step()"]
    if not keep:
        return "\n".join(lines)
    lines += [
        f"# Or keep the {NAMES.get(stored, stored)} weights and give the optimizer FP32 master "
        "copies:",
        "master = [p.detach().float() for p in model.parameters()]",
        f"optimizer = {make}(master, lr={lr_txt})",
        "# each step, after backward():",
        "for m, p in zip(master, model.parameters()):",
        "    m.grad = p.grad.float()",
        "optimizer.step(); optimizer.zero_grad(); model.zero_grad()",
        "with torch.no_grad():",
        "    for m, p in zip(master, model.parameters()):",
        "        p.copy_(m)",
    ]
    return "\n".join(lines)


def _update_made_nonfinite(session: Session) -> dict[str, Any] | None:
    """Where an update of the low-precision weights made them non-finite, or None.

    From the divergence's ``low-precision-update`` cause: the first non-finite step and the
    optimizer's eps that FP16 rounds to 0.
    """
    div: DivergenceResult = derived(session).get("divergence", DivergenceResult(steps=0))
    why = div.get("cause", {})
    if why.get("kind") != "low-precision-update":
        return None
    return {
        "step": div["first"]["step"] if "first" in div else None,
        "eps_below_fp16": why.get("eps_below_fp16"),
    }


@rule("low-precision-params")
def low_precision_params(session: Session) -> Iterator[Finding]:
    """An optimizer updates parameters stored in BF16/FP16 instead of FP32 master weights.

    Severity from the measured share of sampled updates that rounded away (the value did not
    change although its gradient was nonzero): high >= 25%, medium >= 5%, low below; high
    where an update in the weights' dtype made them non-finite (the divergence's
    ``low-precision-update`` cause: an Adam ``eps`` FP16 holds as 0 gives 0/0); medium
    where nothing was measured (a session without the ``weight_updates`` section). Parameters
    whose optimizer keeps an FP32 master copy are not counted; none left: no finding.
    """
    # the scaler's and the models' lists only for a session recorded without the section (they
    # count frozen parameters and master-copied ones alike)
    ev = _measured(session) if session.section("weight_updates") else _fallback(session)
    if ev is None:
        return
    share = ev.get("unchanged_share")
    broke = _update_made_nonfinite(session)
    severity: Severity
    if broke is not None:
        severity = "high"  # an update in the weights' own dtype made them non-finite
        ev["update_made_nonfinite_before_step"] = broke["step"]
        if broke.get("eps_below_fp16") is not None:
            ev["eps_below_fp16"] = broke["eps_below_fp16"]
    elif share is None:
        severity = "medium"
    elif share >= THRESHOLDS.unchanged_high:
        severity = "high"
    elif share >= THRESHOLDS.unchanged_medium:
        severity = "medium"
    else:
        severity = "low"
    dtypes = ev["dtypes"] or {"float16": 1}
    stored = max(dtypes, key=lambda k: dtypes[k])
    names = " and ".join(NAMES.get(k, k) for k in sorted(dtypes))
    who = " / ".join(ev["optimizers"]) or "the optimizer"
    if share is None:
        what = "updates smaller than half a weight's spacing are lost (not measured here)"
    else:
        what = (
            f"{share:.0%} of the sampled updates rounded away (the weight did not change "
            "although its gradient was not zero)"
        )
    if broke is not None:
        what += f"; and their update made them non-finite before step {broke['step']}" + (
            f" (eps={broke['eps_below_fp16']:g} is 0 in FP16: 0/0)"
            if broke.get("eps_below_fp16") is not None
            else ""
        )
    lrs = ev.get("lr") or []
    yield Finding(
        id="low-precision-params",
        severity=severity,
        title=(
            f"{ev['low_precision_params'] - int(ev.get('master_params') or 0)} parameters are "
            f"stored in {names} and {who} updates "
            f"them in place, with no FP32 master weights: {what}."
        ),
        evidence={**ev, "threshold": THRESHOLDS.unchanged_medium},
        fix=fix_code(
            session.environment,
            stored,
            lrs[0] if len(lrs) == 1 else None,
            ev["optimizers"][0] if len(ev["optimizers"]) == 1 else None,
            choice.precision if (choice := pc.measured(session).choice) is not None else None,
        ),
        section=SECTION,
        impact=0.8 if share is None else max(0.3, min(1.0, float(share))),
    )


#: Backwards that began with the last step's gradients uncleared: at least this many, and this
#: share of those checked (a loop that forgets ``zero_grad`` does it every step).
STALE_MIN = 2
STALE_SHARE = 0.5


@rule("grads-not-zeroed")
def grads_not_zeroed(session: Session) -> Iterator[Finding]:
    """Gradients are not cleared between optimizer steps (high).

    The ``weight_updates`` section's check: the first backward after an optimizer step found
    the step's gradients still in place, untouched (the same tensors, no in-place change:
    neither ``zero_grad()`` nor ``zero_()`` ran), so each update applies the sum of every
    earlier step's gradients. High when at least ``STALE_MIN`` backwards and ``STALE_SHARE``
    of those checked began so. Runs with several optimizers are not checked (one's backward
    may add to the other's gradients before it clears them).
    """
    stale = session.section("weight_updates").get("grads_not_cleared") or {}
    checked, bad = int(stale.get("checked") or 0), int(stale.get("not_cleared") or 0)
    if bad < STALE_MIN or bad < STALE_SHARE * checked:
        return
    yield Finding(
        id="grads-not-zeroed",
        severity="high",
        title=(
            f"The gradients are never cleared between optimizer steps: {bad} of {checked} "
            "backwards began with the last step's gradients still in place, so each update "
            "applies the sum of all earlier steps' gradients."
        ),
        evidence={
            "not_cleared": bad,
            "checked": checked,
            "first_steps": list(stale.get("steps") or [])[:10],
        },
        fix=(
            "Clear the gradients once per optimizer step (after the step, or before the "
            "step's first backward):\n"
            "optimizer.step()\n"
            "optimizer.zero_grad(set_to_none=True)"
        ),
        section=SECTION,
        impact=1.0,
    )
