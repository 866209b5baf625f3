"""Whether the run diverged or stalled, from which step, and whether precision caused it.

The one result every surface leads with on a broken run (`assess`, stored by the derive step
as ``derived.divergence``):

* ``verdict``: ``diverged`` (the run ends with a non-finite loss: the weights are lost),
  ``stalled`` (the loss stays finite but an enabled GradScaler skips every step to the end,
  or its scale collapsed: the weights no longer change), or ``healthy`` (no inf/NaN, or only
  steps the run recovered from: ``recovered_steps``).
* ``first``: the first non-finite step that matters -- the loss or a module output, or a
  gradient where no enabled GradScaler skipped it (a skip while the scaler searches its scale
  is not a fault) -- and what held it (``loss``, ``activation``, ``gradient``, and
  ``parameter`` when the replay measured a non-finite weight after that step's update), with
  the module the sentinel named.
* ``cause``: from the sentinel's replay of that step (`divergence_replay`) and the loss trend
  before it, each with the numbers it rests on:

  - ``not-precision``: the run computed in FP32; or the finite loss was already exploding
    (it grew ``loss_growth`` times over its start in the steps before: a too-high learning
    rate in FP16 overflows FP16 at weights FP32 still holds -- the trend, not the replay,
    is the evidence); or the step is non-finite in the FP32 replay too. A loss that grew
    while the weights did not (`weights_growth` below ``weights_held``: one batch's huge
    loss) is not exploding: the updates did not cause the step.
  - ``precision``: the step is finite in FP32 where the run's was not (and the loss was not
    already blowing up): ``detail`` says which overflow, where.
  - ``unknown``: no replay (or a failed one), or only the loss was non-finite while the
    model's output was finite (the replay runs the model, not the loss function).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ampdiag import units
from ampdiag.analysis import fp16range
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.derive import part
from ampdiag.schema import DivergenceCause, DivergenceResult, LossTrend
from ampdiag.session import Session


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # The finite loss is "exploding" before the first non-finite step when its last values
    # reach this many times its first ones (median of the first three).
    loss_growth: float = 10.0
    # Finite losses needed before the first non-finite step to judge a trend.
    trend_min_steps: int = 3
    # ... or one jump: the last finite loss this many times its start, from two finite losses
    # (the first non-finite step's own loss counts where finite: its gradients went first).
    loss_jump: float = 100.0
    # ... unless the weights the first non-finite step ran with are finite and within this
    # factor (max |w| and L2 norm) of the run's first step's (the replay measures both): a
    # learning rate too high blows the loss up through the weights, which grow many times
    # over (46x to over 10^20x in the corpus' runs); one batch's huge loss leaves them where
    # they were (1.01x), and the non-finite step is then that step's own fault.
    weights_held: float = 2.0
    # Skipped steps in a row, to the run's end, that make a stall (fewer: the scaler searching
    # its scale), unless every step of a shorter run was skipped.
    stall_skips: int = 8
    # A loss scale below this has collapsed (numerics' loss-scale-collapse agrees).
    scale_collapse_abs: float = 1.0


THRESHOLDS = Thresholds()

FP16_MAX = units.count(fp16range.FP16_MAX)
#: What the result cites of each replay (`divergence_replay.replay_step`).
REPLAY_KEYS = (
    "finite",
    "origin",
    "max_abs",
    "max_abs_module",
    "grad_max_abs",
    "grad_max_abs_module",
    "backward_replayed",
    "error",
    "op",
)
CAUSES = ("precision", "not-precision", "unknown")


def losses(session: Session) -> list[tuple[int, float]]:
    """(step, loss) of every step that recorded one, in order (non-finite ones as nan/inf)."""
    out = []
    for s in session.steps:
        value = units.number(s.get("loss"))
        if isinstance(s.get("index"), int) and value is not None:
            out.append((int(s["index"]), value))
    return out


def with_history(points: list[tuple[int, float]], history: Any) -> list[tuple[int, float]]:
    """``points`` with the sentinel's finite losses of the steps they lack, in step order.

    The sentinel keeps the run's losses into its first non-finite step (`sentinel.LOSS_HEAD`
    first ones, the last ones before it): a window's session has only the window's steps,
    and the trend into a divergence before the window is the sentinel's.
    """
    known = {i for i, _ in points}
    extra = [
        (int(p[0]), float(p[1]))
        for p in (history if isinstance(history, list) else [])
        if isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], int)
        and p[0] not in known
        and isinstance(p[1], (int, float))
        and math.isfinite(p[1])
    ]
    return sorted([*points, *extra])


def trend(points: list[tuple[int, float]], before: int) -> LossTrend:
    """The finite loss up to step ``before``: its start, its last values, how much it grew.

    Step ``before``'s own loss counts where it is finite (its gradients or weights went
    non-finite first, its forward did not).
    """
    finite = [(i, v) for i, v in points if i <= before and math.isfinite(v)]
    out: LossTrend = {"steps": len(finite)}
    if not finite:
        return out
    # the start: the first three losses, never the last one (a jump is measured against it)
    start = statistics.median(abs(v) for _, v in finite[: max(1, min(3, len(finite) - 1))])
    last = max(abs(v) for _, v in finite[-2:])
    out |= {
        "first_loss": finite[0][1],
        "last_finite_loss": finite[-1][1],
        "last_finite_step": finite[-1][0],
        "start_median_abs": start,
    }
    if start > 0:
        out["growth"] = last / start
    growth = out.get("growth", 0.0)
    out["exploding"] = bool(
        (len(finite) >= THRESHOLDS.trend_min_steps and growth >= THRESHOLDS.loss_growth)
        or (len(finite) >= 2 and growth >= THRESHOLDS.loss_jump)
    )
    return out


def weights_growth(replay: dict[str, Any] | None, step: int) -> float | None:
    """How many times over the weights grew from the run's first step to ``step``.

    The larger of the max |w| and the L2 norm ratios, from the replay of ``step`` (its weights
    before its update: `divergence_replay`); inf where they are no longer finite; None where
    that step was not replayed or its weights not measured.
    """
    if not replay or replay.get("step") != step:
        return None
    now = replay.get("weights") or {}
    start = now.get("start") or {}
    ratios = []
    for key in ("max_abs", "norm"):
        a, b = now.get(key), start.get(key)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b > 0:
            return None
        ratios.append(a / b if math.isfinite(a) and math.isfinite(b) else math.inf)
    return max(ratios)


def unfixed_by_precision(session: Session) -> bool:
    """Whether the run diverged or stalled for a reason no precision fixes (derived first).

    A precision recommendation (autocast, a faster dtype) is then not the run's problem now:
    the rules that make one lower it below high, so the divergence's own fix leads.
    """
    div: DivergenceResult = session.section("derived").get("divergence") or {"steps": 0}
    cause = div.get("cause", {}).get("cause")
    return div.get("verdict") in ("diverged", "stalled") and cause == "not-precision"


def replayed_origin(replay: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where the eager replay of a compiled model in its own precision went non-finite.

    The sentinel sees a compiled model as one module (its submodules run inside the compiled
    graph); the replay of its first non-finite step runs the wrapped module eagerly, with
    each submodule seen (`divergence_replay`: the ``run`` result), and names the one that
    made the value. None where no such replay ran or it stayed finite.
    """
    if not (replay or {}).get("compiled"):  # a run replay of an eager model: its op only
        return None
    run = ((replay or {}).get("results") or {}).get("run") or {}
    origin = run.get("origin")
    return dict(origin) if isinstance(origin, dict) and origin.get("module") else None


def is_wrapper_name(module: Any) -> bool:
    """Whether the sentinel named a model's root ("(OptimizedModule)"), not a submodule."""
    return isinstance(module, str) and module.startswith("(") and module != "(loss)"


@part("divergence")
def assess(session: Session) -> DivergenceResult | None:
    """The divergence result (see the module doc), or None when no step was watched."""
    sentinel = session.section("sentinel")
    points = losses(session)
    if not sentinel and not points:
        return None
    sc = session.section("scaler")
    enabled = bool((sc.get("scaler") or {}).get("enabled"))
    skipped = set(units.ints(sc.get("skipped_steps")))
    n_steps = max(len(session.steps), int(sentinel.get("steps_watched") or 0))
    last_step = max([i for i, _ in points] + [n_steps - 1]) if n_steps or points else -1
    # The sentinel's last step: past the listed steps of a long run, and past a window's
    # steps when it watched the whole run (the scaler's skips are the window's only).
    watched_last = sentinel.get("last_step")
    skips_last = last_step
    if isinstance(watched_last, int):
        recorded = [i for i, _ in points] + [int(s["index"]) for s in session.steps]
        skips_last = max(recorded, default=last_step)
        last_step = max(last_step, watched_last)
    loss_bad = sorted(
        set(units.ints(sentinel.get("loss_nonfinite_steps")))
        | {i for i, v in points if not math.isfinite(v)}
    )
    fwd = sentinel.get("forward_origin") or None
    bwd = sentinel.get("backward_origin") or None
    backward_only = units.ints(sentinel.get("backward_only_steps"))
    # The first non-finite step that matters, and what held it.
    candidates: list[tuple[int, str, str | None]] = []
    if fwd:
        held = "loss" if fwd.get("phase") == "loss" else "activation"
        candidates.append((int(fwd["step"]), held, fwd.get("module")))
    if loss_bad:
        candidates.append((loss_bad[0], "loss", "(loss)"))
    excused = enabled and all(s in skipped for s in backward_only)
    if bwd and not excused:
        candidates.append((int(bwd["step"]), "gradient", bwd.get("module")))
    result: DivergenceResult = {"steps": n_steps}
    # Stall: skipped to the end (or the scale collapsed) with the loss finite.
    tail = 0
    for i in range(skips_last, -1, -1):
        if i not in skipped:
            break
        tail += 1
    scale_min = sc.get("scale_min")
    history = sc.get("history") or []
    if not isinstance(scale_min, (int, float)) and history:
        scale_min = min(float(h.get("scale_after", h["scale"])) for h in history)
    collapsed = (
        enabled
        and isinstance(scale_min, (int, float))
        and scale_min < THRESHOLDS.scale_collapse_abs
    )
    stall_from = skips_last - tail + 1 if tail else None
    stalled = enabled and (
        (tail >= THRESHOLDS.stall_skips or (tail and tail == n_steps and n_steps >= 2)) or collapsed
    )
    ends_bad = (bool(loss_bad) and loss_bad[-1] == last_step) or (
        watched_last == last_step and bool(sentinel.get("last_loss_nonfinite"))
    )
    if stalled and not candidates and stall_from is not None:
        candidates.append((stall_from, "gradient", bwd.get("module") if bwd else None))
    if not candidates:
        result["verdict"] = "healthy"
        return result
    step, held, module = min(candidates, key=lambda c: c[0])
    holders = sorted({h for s, h, _ in candidates if s == step})
    replay = sentinel.get("replay") or {}
    located = replayed_origin(replay) if replay.get("step") == step else None
    if located and (module is None or is_wrapper_name(module)):
        module = located["module"]  # the compiled model's submodule, from the eager replay
    if replay.get("step") == step and replay.get("parameters_finite_after") is False:
        holders.append("parameter")  # measured after the step's update
    made_by_update = replay.get("step") == step and _weights_went_bad(replay)
    if made_by_update:
        holders = sorted({*holders, "parameter"})
    result["first"] = {"step": step, "held": holders, "module": module}
    if made_by_update:
        # the weights step ``step`` began with were non-finite: an earlier update made them
        result["first"]["weights_nonfinite_before"] = True
    result["loss_nonfinite_steps"] = len(loss_bad)
    result["skipped_steps"] = int(sc.get("skipped_total", len(skipped))) if enabled else 0
    if enabled and isinstance(scale_min, (int, float)):
        result["scale_min"] = float(scale_min)
        result["scale_collapsed"] = bool(collapsed)
    if enabled and tail:
        result["skipped_to_end_from"] = stall_from
    if ends_bad:
        result["verdict"] = "diverged"
    elif stalled:
        result["verdict"] = "stalled"
    else:
        result["verdict"] = "healthy"
        result["recovered_steps"] = sorted({s for s, _, _ in candidates} | set(loss_bad))[:20]
    result["trend"] = trend(with_history(points, sentinel.get("loss_history")), step)
    grown = weights_growth(replay, step)
    if grown is not None:
        result["trend"]["weights_growth"] = grown
        if result["trend"].get("exploding") and grown < THRESHOLDS.weights_held:
            result["trend"]["exploding"] = False
            result["trend"]["weights_held"] = True
    result["cause"] = cause(session, result, sentinel.get("replay"))
    return result


def _weights_went_bad(replay: dict[str, Any]) -> bool:
    """Whether the replayed step began with non-finite weights that the run began finite.

    The sentinel checks every step before its update: the first non-finite step's weights
    already non-finite means an optimizer update made them so, from finite gradients.
    """
    now = replay.get("weights") or {}
    start = now.get("start") or {}
    values = [now.get("max_abs"), now.get("norm")]
    begun = [start.get("max_abs"), start.get("norm")]
    return (
        any(isinstance(v, (int, float)) and not math.isfinite(v) for v in values)
        and all(isinstance(v, (int, float)) and math.isfinite(v) for v in begun)
        and start.get("step") != replay.get("step")
    )


def cause(
    session: Session, result: DivergenceResult, replay: dict[str, Any] | None
) -> DivergenceCause:
    """Whether precision caused the first non-finite step, and the numbers that say so."""
    first = result["first"]
    precision = computes_in(session)["precision"]  # the live replay's own among what it weighs
    out: DivergenceCause = {"run_precision": precision}
    if replay:
        out["replay_step"] = replay.get("step")
        out["micro_batch"] = replay.get("micro_batch")
        out["replay"] = {
            name: {k: r.get(k) for k in REPLAY_KEYS if k in r}
            for name, r in (replay.get("results") or {}).items()
        }
        if replay.get("backward_not_replayed"):
            out["backward_not_replayed"] = replay["backward_not_replayed"]
        if replay.get("loss_scale") is not None:
            out["loss_scale"] = replay["loss_scale"]
        if replay.get("upcast"):
            out["upcast"] = replay["upcast"]
        if replay.get("state_restored"):
            out["state_restored"] = replay["state_restored"]
    fp32 = ((replay or {}).get("results") or {}).get("fp32") or {}
    trend_: LossTrend = result.get("trend") or {"steps": 0}
    if precision == "fp32":
        grew = (
            f"; the finite loss grew {_times(trend_['growth'])} over its start first"
            if trend_.get("exploding")
            else _held(trend_, first["step"])
        )
        return out | {"cause": "not-precision", "why": f"the run computes in FP32{grew}"}
    if trend_.get("exploding"):
        held = ""
        if fp32.get("finite") and replay and replay.get("step") == first["step"]:
            held = (
                f"; FP32 still holds step {first['step']} (|x| up to "
                f"{units.count(fp32.get('max_abs', 0))} in {fp32.get('max_abs_module')}), but "
                "the weights are diverging"
            )
        elif fp32.get("finite") is False:
            held = f"; step {replay.get('step') if replay else '?'} is non-finite in FP32 too"
        return out | {
            "cause": "not-precision",
            "why": (
                f"the finite loss grew {_times(trend_['growth'])} over its start in the "
                f"{trend_['steps']} steps before step {first['step']}{held}"
            ),
        }
    if first.get("weights_nonfinite_before"):
        return out | _update_cause(session, first["step"], replay or {})
    if not replay or "error" in replay or "finite" not in fp32:
        why = (replay or {}).get("error") or fp32.get("error") or "the step was not replayed"
        return out | {"cause": "unknown", "why": f"no FP32 replay: {why}"}
    in_stall = (
        result.get("verdict") == "stalled"
        and replay.get("trigger") == "backward"
        and int(replay.get("step", -1)) >= int(result.get("skipped_to_end_from", 1 << 62))  # type: ignore[arg-type]
    )  # every step of a skipped stretch starts from the same weights
    if replay.get("step") != first["step"] and not in_stall:
        return out | DivergenceCause(
            cause="unknown",
            why=f"the replayed step {replay.get('step')} is not step {first['step']}",
        )
    if fp32["finite"] is False:
        where = fp32.get("origin") or {}
        return out | DivergenceCause(
            cause="not-precision",
            why=(
                f"step {first['step']} is non-finite in FP32 too (the {where.get('kind')} of "
                f"{where.get('module')}, {where.get('phase')})" + _held(trend_, first["step"])
            ),
            module=where.get("module"),
        )
    if first["held"] == ["loss"]:
        return out | {
            "cause": "unknown",
            "why": (
                "only the loss was non-finite and the model's output finite: the replay runs "
                "the model, not the loss function"
            ),
        }
    detail = _precision_detail(fp32, precision, out.get("loss_scale"))
    op = ((replay.get("results") or {}).get("run") or {}).get("op") or {}
    if op.get("constant") is not None or op.get("function"):
        detail = _op_detail(op)
    bf16 = ((replay.get("results") or {}).get("bf16") or {}).get("finite")
    return out | {  # type: ignore[no-any-return]
        "cause": "precision",
        "why": (
            f"step {replay.get('step')} is finite in the FP32 replay"
            + (
                f" (step {first['step']}'s weights: every step since was skipped)"
                if replay.get("step") != first["step"]
                else ""
            )
            + f"; {detail['text']}"
        ),
        "bf16_finite": bf16,
        **detail,
    }


def _update_cause(session: Session, step: int, replay: dict[str, Any]) -> DivergenceCause:
    """The cause where an optimizer update made the weights non-finite (`_weights_went_bad`).

    A replay from those weights is non-finite in any precision and proves nothing. Where the
    weights are stored in FP16/BF16 (the replay upcast them), the update ran in that dtype --
    Adam's state too: its ``eps`` below FP16's smallest subnormal (6e-8) is 0, and a
    gradient whose square underflows gives 0/0 -- so the precision is the cause. FP32 weights
    made non-finite by finite gradients: not measured here.
    """
    stored = replay.get("upcast")
    if not stored:
        return {
            "cause": "unknown",
            "why": (
                f"the weights were already non-finite when step {step} began (an optimizer "
                "update made them so): a replay from them proves nothing"
            ),
            "kind": "update",
        }
    eps = sorted(
        {
            float(e)
            for o in session.section("weight_updates").get("optimizers") or []
            for e in o.get("eps") or []
        }
    )
    rounds_to_0 = 2.0 ** (fp16range.FP16_MIN_SUBNORMAL_LOG2 - 1)  # half the smallest subnormal
    tiny = [e for e in eps if 0 < e <= rounds_to_0] if stored == "float16" else []
    detail = (
        f"; the optimizer's eps={tiny[0]:g} is 0 in FP16 (its smallest value is 6e-08): a "
        "gradient whose square underflows gives 0/0"
        if tiny
        else ""
    )
    return {
        "cause": "precision",
        "kind": "low-precision-update",
        "why": (
            f"the {stored} weights were already non-finite when step {step} began, with every "
            f"earlier step's loss and gradients finite: the optimizer's update in {stored} "
            f"made them{detail}"
        ),
        "text": f"the optimizer's update of the {stored} weights made them non-finite{detail}",
        "eps_below_fp16": tiny[0] if tiny else None,
        "upcast": stored,
    }


def _held(trend_: LossTrend, step: int) -> str:
    """Why a loss that grew is not read as the updates' (`weights_held`), or ""."""
    if not trend_.get("weights_held"):
        return ""
    return (
        f"; the finite loss grew {_times(trend_['growth'])} over its start, but step {step}'s "
        f"weights are {_times(trend_['weights_growth'])} the first step's: one batch's loss, "
        "not the updates"
    )


def _times(growth: float) -> str:
    """A growth factor in words, without scientific notation ("61.1x", "over 1,000,000x")."""
    return "over 1,000,000x" if growth > 1e6 else f"{units.count(round(growth, 1))}x"


def _op_detail(op: dict[str, Any]) -> DivergenceCause:
    """What the op that made the value says (the replay in the run's precision).

    A constant beyond the dtype's range (a -1e9 mask in FP16), or a custom autograd Function
    fed low precision: each has its own fix, not the module's float32.
    """
    where = f" in {op['module']}" if op.get("module") else ""
    dtype = str(op.get("dtype") or "float16")
    if op.get("constant") is not None:
        text = (
            f"the {op.get('op')}{where} uses the constant {op['constant']:g}, beyond "
            f"{dtype}'s range, which makes it inf (a mask filled with a large negative number)"
        )
        return {"kind": "mask-constant", "module": op.get("module"), "op": op, "text": text}
    text = (
        f"the custom autograd Function {op['function']}{where} computes in {dtype} (autocast "
        f"feeds it {dtype} inputs): its {op.get('op')} went non-finite"
    )
    return {"kind": "custom-function", "module": op.get("module"), "op": op, "text": text}


def _precision_detail(fp32: dict[str, Any], precision: str, scale: Any) -> DivergenceCause:
    """Which range the run's precision left: a forward value, or a (scaled) gradient."""
    if precision != "fp16":
        return {"kind": "rounding", "text": f"{precision} rounding made it"}
    peak = fp32.get("max_abs")
    if isinstance(peak, (int, float)) and peak >= fp16range.FP16_MAX:
        return {
            "kind": "forward-overflow",
            "module": fp32.get("max_abs_module"),
            "max_abs": peak,
            "text": (
                f"the output of {fp32.get('max_abs_module')} reaches |x| = {units.count(peak)} "
                f"in FP32, beyond FP16's max {FP16_MAX}"
            ),
        }
    g = fp32.get("grad_max_abs")
    s = float(scale) if isinstance(scale, (int, float)) else 1.0
    if isinstance(g, (int, float)) and g * s >= fp16range.FP16_MAX:
        return {
            "kind": "gradient-overflow",
            "module": fp32.get("grad_max_abs_module"),
            "grad_max_abs": g,
            "text": (
                f"the gradient reaches |g| = {units.count(g)} (at "
                f"{fp32.get('grad_max_abs_module')}), {units.count(g * s)} at the loss scale "
                f"{units.count(s)}: beyond FP16's max {FP16_MAX}"
            ),
        }
    return {"kind": "fp16-range", "text": "FP16's range or rounding made it"}
