"""The ``diverged`` / ``stalled`` finding: the run's verdict, its first step, and its cause.

An advisor (it runs before the precision advice, `ADVISOR_MODULES`): it reads the divergence
result (`ampdiag.analysis.divergence.assess`) and, for a run that diverged or stalled, emits
one high finding that names the first non-finite step, what held it and the measured cause,
with the fix that fits the cause. Where precision did not cause it (or the cause is unknown)
it merges the findings that are this one event's symptoms (``nonfinite-origin``,
``skipped-steps``, ``loss-scale-collapse``, ``activation-overflow``, ``fp16-grad-underflow``
measured at the scale the scaler backed off to): the precision advice
then has nothing to answer, and a run that diverges in FP32 too gets no precision advice.
Where precision caused it, the symptoms stay for the precision advice, which is the fix.
A non-finite step the run recovered from (precision not the cause): ``nonfinite-origin``
explains the GradScaler's skips of those steps (`_recovered`).

Thresholds: `ampdiag.analysis.divergence.THRESHOLDS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ampdiag.analysis import device
from ampdiag.analysis.advisors import Advice, advisor, find, terms
from ampdiag.analysis.derive import derived
from ampdiag.schema import DivergenceCause, DivergenceResult, FirstNonfinite
from ampdiag.session import Finding, Session

#: One event's symptoms: the weights blowing up overflow FP16, the scaler backs off to a scale
#: at which the rest underflows.
SYMPTOMS = (
    "nonfinite-origin",
    "skipped-steps",
    "loss-scale-collapse",
    "activation-overflow",
    "fp16-grad-underflow",
)

#: Causes the replay in the run's precision traced to one op (`divergence._op_detail`).
OP_KINDS = ("mask-constant", "custom-function")


@advisor("diverged", "stalled", "nonfinite-origin")
def divergence_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """The run's divergence verdict as one finding: ``diverged`` or ``stalled`` (high).

    diverged: the run ends with a non-finite loss; stalled: an enabled GradScaler skips
    every step to the end (``stall_skips`` in a row) or its scale fell below 1, with the
    loss finite. Evidence: the first non-finite step, what held it, the
    cause (``precision`` / ``not-precision`` / ``unknown``) with why, the FP32/BF16 replay's
    figures and the loss trend before the step.
    """
    result = derived(session).get("divergence")
    if not result:
        return
    if result["verdict"] not in ("diverged", "stalled"):
        yield from _recovered(result, findings)
        return
    first, why = result["first"], result["cause"]
    dev = device.device_type(session.environment)
    verdict = result["verdict"]
    evidence: dict[str, Any] = {
        "verdict": verdict,
        "step": first["step"],
        "held": first["held"],
        "module": first.get("module"),
        "cause": why["cause"],
        **{k: why.get(k) for k in ("why", "run_precision")},
        **{k: result.get(k) for k in ("loss_nonfinite_steps", "steps", "skipped_steps")},
        "loss_trend": result.get("trend"),
    }
    stated = ("scale_min", "scale_collapsed", "skipped_to_end_from")
    evidence |= {k: result[k] for k in stated if k in result}  # type: ignore[literal-required]
    cited = (
        "replay",
        "replay_step",
        "loss_scale",
        "backward_not_replayed",
        "kind",
        "state_restored",
    )
    evidence |= {k: why[k] for k in cited if k in why}  # type: ignore[literal-required]
    what = "diverged" if verdict == "diverged" else "stalled"
    held = " and ".join(first["held"])
    where = f" ({first['module']})" if first.get("module") else ""
    because = {
        "precision": f"caused by {why.get('run_precision', 'the precision').upper()}",
        "not-precision": "not caused by the precision",
        "unknown": "cause not measured",
    }[why["cause"]]
    title = (
        f"The run {what} at step {first['step']}: the {held}{where} became non-finite"
        if verdict == "diverged"
        else f"The run stalled from step {first['step']}: every step to the end is skipped"
    ) + f" -- {because} ({why.get('why')}){_outside_window(session, first['step'])}."
    rec = Finding(
        id=verdict,
        severity="high",
        title=title,
        evidence=evidence,
        fix=_fix(session, result, dev),
        section="numerics",
        impact=1.0,
    )
    symptoms = find(findings, *SYMPTOMS) if why["cause"] != "precision" else []
    if why.get("kind") in OP_KINDS:  # the op's own fix replaces the module's "float32"
        symptoms = find(findings, "nonfinite-origin", "activation-overflow")
    yield Advice(rec, symptoms)


def _recovered(result: DivergenceResult, findings: list[Finding]) -> Iterator[Advice]:
    """A non-finite step the run recovered from, not caused by precision: its skips are its.

    The GradScaler skipped the steps whose loss was non-finite (no more skips than those):
    ``nonfinite-origin`` explains ``skipped-steps``, whose scaler fix would answer a NaN that
    no loss scale makes.
    """
    if (result.get("cause") or {}).get("cause") != "not-precision":
        return
    origin, skips = find(findings, "nonfinite-origin"), find(findings, "skipped-steps")
    bad = int(result.get("loss_nonfinite_steps") or 0)
    if origin and skips and int(result.get("skipped_steps") or 0) <= max(bad, 1):
        yield Advice(origin[0], skips)


def _outside_window(session: Session, step: int) -> str:
    """Where a window's session diagnosed other steps: that the step is outside them."""
    if not session.section("run").get("window"):
        return ""
    indices = [s["index"] for s in session.steps if isinstance(s.get("index"), int)]
    if not indices or min(indices) <= step <= max(indices):
        return ""
    side = "before" if step < min(indices) else "after"
    return (
        f"; {side} the diagnosed steps {min(indices)}–{max(indices)}, "
        "found by the sentinel, which watches every step"
    )


def _fix(session: Session, result: DivergenceResult, dev: str) -> str:
    """The fix that fits the cause, with code for the run's device."""
    first, why = result["first"], result["cause"]
    step = first["step"]
    if why["cause"] == "precision":
        # The local fix only: which precision to train in is the precision advice's (one
        # recommendation, measured by the A/B where it ran), never a second opinion here.
        # where the run's first inf/NaN appeared (the sentinel), else the replay's largest value
        module: str | None = first.get("module") or why.get("module") or "that module"
        if why.get("upcast"):  # the weights are stored in low precision, outside autocast
            lines = [
                f"{why.get('upcast')} weights cannot hold step {step}: "
                f"{why.get('text', why.get('why'))}.",
                "Keep the weights in float32 and compute in low precision through autocast:",
                "model = model.float()   # not model.half(); make the optimizer after it",
                terms.training_step("bf16", dev),
            ]
            if why.get("eps_below_fp16"):
                lines.append(
                    "# or, keeping FP16 weights: an eps FP16 holds, "
                    "torch.optim.Adam(model.parameters(), eps=1e-4)"
                )
            return "\n".join(lines)
        if why.get("kind") == "mask-constant":  # the op replayed in the run's precision
            return f"{terms.mask_fill_fix()}\n# in {module}"
        if why.get("kind") == "custom-function":
            name = (why.get("op") or {}).get("function") or "MyFunction"
            return terms.custom_function_fix(dev).replace("MyFunction", name, 1)
        lines = [
            f"FP16 cannot hold step {step}: {why.get('text', why.get('why'))}.",
            f"Keep {module} in float32 (its forward and backward):",
            terms.fp32_module(dev),
        ]
        if why.get("bf16_finite"):
            lines.append("# The BF16 replay of this step is finite: BF16's range holds it.")
        lines.append("# Or change the run's precision: see the precision recommendation.")
        return "\n".join(lines)
    exploding = bool(result.get("trend", {"steps": 0}).get("exploding"))
    fp32 = (why.get("replay") or {}).get("fp32") or {}
    if why["cause"] == "unknown":
        return _unknown_fix(step, why, dev, _fsdp_policy(session))
    if exploding:
        scaled = bool(result.get("skipped_steps"))
        return "\n".join(
            [
                "The updates are too large (the loss blows up whatever the precision): lower the "
                "learning rate (say 10x), warm it up, and clip the gradients:",
                "for group in optimizer.param_groups:",
                "    group['lr'] /= 10",
                "warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, "
                "total_iters=500)",
                *(["scaler.unscale_(optimizer)"] if scaled else []),
                "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
                ("scaler.step(optimizer); scaler.update()" if scaled else "optimizer.step()")
                + "; warmup.step()",
                "# No precision change fixes this.",
            ]
        )
    module = _op_module(first, why, fp32)
    return "\n".join(
        [
            f"Step {step}'s batch makes {module or 'the model'} non-finite in FP32 too: a 0/0, "
            "log 0, sqrt of 0 in the backward, or an inf/NaN in the data -- not the precision.",
            f"Find the batch (micro-batch {why.get('micro_batch', 0)} of step {step}) and guard "
            f"the op in {module or 'that module'}:",
            "assert torch.isfinite(x).all(), 'non-finite input'",
            "y = x / d.clamp_min(1e-6)          # not x / d",
            "y = torch.log(x.clamp_min(1e-6))   # not torch.log(x)",
            f"# on {dev}: skip a bad batch with `if not torch.isfinite(loss): continue`",
        ]
    )


def _fsdp_policy(session: Session) -> bool:
    """Whether the run computes in low precision through an FSDP2 MixedPrecisionPolicy."""
    return any(
        isinstance(m, dict) and m.get("fsdp_mixed_precision")
        for m in session.section("run").get("models") or []
    )


def _unknown_fix(step: int, why: DivergenceCause, dev: str, fsdp: bool = False) -> str:
    """The cause was not measured: how to measure it, never a guess at it.

    A replay that did not run (or failed) is no evidence either way: the fix is the
    measurement that tells precision from the rest -- the same steps in FP32.
    """
    precision = str(why.get("run_precision") or "fp32")
    if precision == "fp32":
        return "\n".join(
            [
                f"Find what made step {step} non-finite: check its batch and the op named "
                "above, and log the loss each step:",
                "assert torch.isfinite(x).all(), 'non-finite input'",
                "if not torch.isfinite(loss): print(step, loss)",
            ]
        )
    head = (
        f"Measure whether {precision.upper()} caused it: run the same steps in FP32 and see "
        f"whether step {step} stays finite:"
    )
    if fsdp:  # FSDP2 computes in its policy's dtype: the lever is the policy
        run = [
            "policy = MixedPrecisionPolicy(param_dtype=torch.float32)   # FP32 compute",
            "fully_shard(module, mp_policy=policy)   # each module, then the root",
        ]
    else:
        run = [
            "model = model.float()   # FP32 weights",
            f"with torch.autocast('{dev}', enabled=False):   # no low-precision compute",
            "    loss = loss_fn(model(x), y)",
        ]
    tell = "# finite in FP32: a precision problem; non-finite too: the data, an op or the"
    return "\n".join([head, *run, f"{tell} learning rate"])


def _op_module(first: FirstNonfinite, why: DivergenceCause, fp32: dict[str, Any]) -> str | None:
    """The module whose op to guard when the step is non-finite whatever the precision.

    The sentinel's origin (the run's own step, where a parent's own code between two children
    is told apart from the children) where the run computes in FP32 -- the replay then repeats
    the same computation -- or where the replay's first non-finite output is inside it (the
    replay names the first module output, never a parent's code); else where FP32 went
    non-finite, which is the op no precision holds.
    """
    seen = first.get("module")
    replayed = why.get("module") or (fp32.get("origin") or {}).get("module")
    if seen and seen != "(loss)":
        inside = isinstance(replayed, str) and replayed.startswith(f"{seen}.")
        if why.get("run_precision") == "fp32" or not replayed or inside:
            return str(seen)
    return str(replayed) if replayed else (str(seen) if seen else None)
