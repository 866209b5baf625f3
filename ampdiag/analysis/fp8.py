"""FP8 readiness over the run: the A/B's per-layer verdicts with each layer's amax movement.

The A/B (`ampdiag.sources.live.fp8`) decides each Linear on one batch. A delayed-scaling
recipe (Transformer Engine's ``DelayedScaling``) takes a step's scale from the amax history of
earlier steps, so it also depends on how that amax moves: a step whose amax exceeds every
earlier one by a factor ``g`` saturates every value above ``1/g`` of its amax (``g = 4``
clamps the top three quarters of the range). The amax of every Linear's input, weight and
output gradient on each sampled step (the ``fp8_amax`` section) gives, per operand:

- ``growth``: the largest factor by which a sampled step's amax exceeded the largest of the
  sampled steps before it (below 1: it never did);
- ``range``: the largest over the smallest amax of the sampled steps.

Under the delayed recipe a layer whose ``growth`` exceeds ``THRESHOLDS.amax_growth_max``
is kept in BF16 with that reason; under current scaling (``tensorwise``, ``rowwise``) the
scale follows the amax every step, and the movement is shown, not judged. This is the one
place the verdicts are final: the rule and the report read them from ``derived.fp8``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

from ampdiag.analysis.derive import part
from ampdiag.schema import Fp8Readiness
from ampdiag.session import Session


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # delayed recipe: the factor by which a step's amax may exceed its history's largest; at
    # 2x every value in the top half of the step's range saturates.
    amax_growth_max: float = 2.0


THRESHOLDS = Thresholds()
#: The recipes whose scale comes from earlier steps' amax.
HISTORY_RECIPES = ("delayed",)
OPERANDS = ("input", "weight", "grad_output")


def module_filter(keep: list[str], recipe: str) -> str:
    """The code the user pastes: torchao's conversion with the layers to keep left out."""
    names = ", ".join(repr(n) for n in keep)
    return (
        "from torchao.float8 import Float8LinearConfig, convert_to_float8_training\n"
        f"KEEP_IN_BF16 = {{{names}}}\n\n"
        "def module_filter_fn(module, fqn):\n"
        "    return fqn not in KEEP_IN_BF16\n\n"
        "convert_to_float8_training(\n"
        f"    model, config=Float8LinearConfig.from_recipe_name({recipe!r}),\n"
        "    module_filter_fn=module_filter_fn,\n"
        ")\n"
        "# Transformer Engine: te.Linear for the converted layers, torch.nn.Linear for KEEP_IN_BF16"
    )


def movement(values: list[Any], steps: list[int]) -> dict[str, Any] | None:
    """``growth`` (with the step it happened at), ``range`` and ``steps`` of one amax series.

    None with fewer than two sampled steps that saw the operand with a finite, nonzero amax.
    """
    seen = [
        (int(s), float(v))
        for s, v in zip(steps, values, strict=False)
        if isinstance(v, (int, float)) and v > 0 and v != float("inf")
    ]
    if len(seen) < 2:
        return None
    growth, at, top = 0.0, seen[1][0], seen[0][1]
    for step, value in seen[1:]:
        if value / top > growth:
            growth, at = value / top, step
        top = max(top, value)
    amaxes = [v for _, v in seen]
    return {
        "growth": growth,
        "growth_step": at,
        "range": max(amaxes) / min(amaxes),
        "steps": len(seen),
    }


def readiness(ab_fp8: Mapping[str, Any], amax: Mapping[str, Any]) -> Fp8Readiness:
    """The A/B's FP8 readiness with each layer's ``amax_drift`` and the final verdicts."""
    out = cast(Fp8Readiness, dict(ab_fp8))
    recipe = str(out.get("recipe") or "")
    steps = list(amax.get("steps") or [])
    series = amax.get("layers") or {}
    layers = []
    for row in out.get("layers") or []:
        if not isinstance(row, Mapping):
            continue
        layer = dict(row)
        seen = series.get(layer.get("name")) if isinstance(series, Mapping) else None
        drift = (
            {op: movement(list(seen.get(op) or []), steps) for op in OPERANDS}
            if isinstance(seen, Mapping)
            else None
        )
        layer["amax_drift"] = drift
        reasons = list(layer.get("reasons") or [])
        if recipe in HISTORY_RECIPES and drift:
            limit = THRESHOLDS.amax_growth_max
            for op in OPERANDS:
                m = drift.get(op)
                if m and m["growth"] > limit:
                    reasons.append(
                        f"its {op.replace('_', ' ')} amax grew {m['growth']:.3g}x beyond its "
                        f"history at step {m['growth_step']} (limit {limit:g}x): the delayed "
                        "scale from earlier steps saturates the values above "
                        f"{1 / m['growth']:.0%} of that step's amax"
                    )
        layer["reasons"] = reasons
        layer["verdict"] = "keep-bf16" if reasons else "fp8-safe"
        layers.append(layer)
    out["layers"] = layers
    measured_for = list(out.get("convert") or [])
    out["convert"] = [la["name"] for la in layers if la["verdict"] == "fp8-safe"]
    if out["convert"] != measured_for and out.get("loss_rel_diff_vs_bf16") is not None:
        out["loss_measured_for"] = measured_for  # the batch's own verdicts, before the drift
    out["keep"] = [la["name"] for la in layers if la["verdict"] != "fp8-safe"]
    if layers:
        out["filter"] = module_filter(out["keep"], recipe)
    out["amax_drift"] = (
        f"measured on {len(steps)} sampled steps"
        if len(steps) >= 2
        else "not measured: fewer than two sampled steps saw the Linear layers"
    )
    out["thresholds"] = {**dict(out.get("thresholds") or {}), **asdict(THRESHOLDS)}
    return out


@part("fp8")
def derived_readiness(session: Session) -> Fp8Readiness | None:
    """FP8 readiness, when the A/B timed FP8 (derived part)."""
    ab = session.section("speed_probe").get("precisions")
    row = ab.get("fp8") if isinstance(ab, dict) else None
    if not isinstance(row, dict):
        return None
    return readiness(row, session.section("fp8_amax"))
