"""Findings on gradient accumulation: gradients reset between micro-batches, losses not averaged.

Both read the ``accumulation`` section (sampled steps with two or more backward passes; see
`ampdiag.sources.live.collectors.accumulation` for how each figure is measured).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from statistics import median
from typing import Any

from ampdiag.analysis.advisors import terms
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # grad-accumulation-broken: share of the sampled accumulating steps whose gradients were
    # reset between two backward passes of the step.
    broken_step_share: float = 0.5
    # accumulation-loss-not-averaged: the micro-batches' loss weights (d root / d loss of each
    # backward, GradScaler's scale removed) sum, in the median sampled step, to at least this:
    # averaged micro-batches sum to 1, summed ones to N (N >= 2), so 1.5 separates them.
    loss_weight_sum: float = 1.5


THRESHOLDS = Thresholds()


def _forwards(step: dict[str, Any]) -> int:
    """The model's forwards in the step (a session without the count: one per backward)."""
    value = step.get("forwards", step["micro_batches"])
    return int(value) if isinstance(value, (int, float)) else 0


def _steps(session: Session) -> list[dict[str, Any]]:
    """Sampled steps that accumulate: two or more backward passes, each after its own forward.

    Several losses of one forward, each backpropagated, are not micro-batches; nor are the
    backward passes of a run with several optimizers (a GAN's discriminator on real, then on
    fake data: two losses summed by design, each for its own optimizer's update).
    """
    if len(session.section("run").get("optimizers") or []) > 1:
        return []
    steps = session.section("accumulation").get("steps") or []
    return [
        s
        for s in steps
        if isinstance(s, dict)
        and int(s.get("micro_batches") or 0) >= 2
        and _forwards(s) >= int(s["micro_batches"])
    ]


def broken_steps(session: Session) -> list[dict[str, Any]]:
    """The sampled steps whose gradients were reset between backward passes.

    Empty unless they are at least ``broken_step_share`` of the sampled accumulating steps.
    """
    steps = _steps(session)
    broken = [s for s in steps if s.get("zeroed_before")]
    if not steps or len(broken) / len(steps) < THRESHOLDS.broken_step_share:
        return []
    return broken


def accumulation_broken(session: Session) -> bool:
    """Whether the run's gradient accumulation throws micro-batches away."""
    return bool(broken_steps(session))


@rule("grad-accumulation-broken")
def grad_accumulation_broken(session: Session) -> Iterator[Finding]:
    """Gradients reset between the backward passes of one optimizer step (high).

    Only the micro-batches after the last reset reach the optimizer: the step trains on a
    fraction of its batch while paying for all of it.
    """
    broken = broken_steps(session)
    if not broken:
        return
    first = broken[0]
    n = int(first["micro_batches"])
    kept = n - int(max(first["zeroed_before"]))
    how = first.get("how")
    call = (
        "zero_grad(set_to_none=True) (or .grad = None)"
        if how == "set_to_none"
        else "zero_grad() / .grad.zero_()"
    )
    yield Finding(
        id="grad-accumulation-broken",
        severity="high",
        title=(
            f"Gradient accumulation is broken: gradients are reset between the {n} backward "
            f"passes of a step, so only the last {kept} micro-batch(es) of {n} reach the "
            "optimizer."
        ),
        evidence={
            "micro_batches": n,
            "surviving_micro_batches": kept,
            "zeroed_before_micro_batch": first["zeroed_before"],
            "how": how,
            "steps": [int(s["step"]) for s in broken],
            "sampled_accumulating_steps": len(_steps(session)),
            "threshold": THRESHOLDS.broken_step_share,
        },
        fix=terms.with_setting(
            session,
            terms.accumulation_setting(session, n),
            f"# Reset gradients once per optimizer step: {call} runs between the backward "
            "passes of one step\n"
            + terms.accumulation_loop(n, computes_in(session)["autocast"], None),
        ),
        section="numerics",
        impact=1.0 - kept / n,
    )


@rule("accumulation-loss-not-averaged")
def accumulation_loss_not_averaged(session: Session) -> Iterator[Finding]:
    """Micro-batch losses summed instead of averaged (medium).

    The median sampled step's micro-batch loss weights sum to >= 1.5: the accumulated gradient
    is that many times the mean micro-batch gradient, so the learning rate is in effect
    multiplied by it (and changes whenever the number of micro-batches does).
    """
    steps = [s for s in _steps(session) if s.get("loss_weight_sum") is not None]
    if not steps:
        return
    total = median(float(s["loss_weight_sum"]) for s in steps)
    if total < THRESHOLDS.loss_weight_sum:
        return
    n = int(median(int(s["micro_batches"]) for s in steps))
    ratios = [float(s["grad_norm_ratio"]) for s in steps if s.get("grad_norm_ratio") is not None]
    yield Finding(
        id="accumulation-loss-not-averaged",
        severity="medium",
        title=(
            f"The {n} micro-batch losses of each step are summed, not averaged: the "
            f"accumulated gradient is {total:.3g}x the mean micro-batch gradient."
        ),
        evidence={
            "micro_batches": n,
            "loss_weight_sum": round(total, 4),
            "loss_weights": steps[0].get("loss_weights"),
            "grad_norm_ratio": round(median(ratios), 4) if ratios else None,
            "steps": [int(s["step"]) for s in steps],
            "threshold": THRESHOLDS.loss_weight_sum,
        },
        fix=terms.with_setting(
            session,
            terms.accumulation_setting(session, n),  # the framework divides the loss itself
            f"loss = loss_fn(model(x), y) / {n}   # each micro-batch's loss, before backward\n"
            "loss.backward()\n"
            "# (or keep the sum and divide the learning rate by the number of micro-batches)",
        ),
        section="numerics",
        impact=0.5,
    )
