"""Findings from the numerics sections: gradients, activations and scaler.

Why an FP16 run learns nothing (gradients flushed to zero), diverges (NaN/inf, overflow), or
misuses the GradScaler. Thresholds are in ``THRESHOLDS``; every rule states its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ampdiag import units
from ampdiag.analysis import divergence, fp16range
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.advisors import terms
from ampdiag.analysis.compute import DTYPES, computes_in
from ampdiag.analysis.derive import derived
from ampdiag.analysis.device import advisable, device_type
from ampdiag.analysis.registry import rule
from ampdiag.schema import DivergenceResult
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Share of nonzero gradient values FP16 holds as zero or subnormal (|g·S| < 2^-14).
    underflow_medium: float = 0.05
    underflow_high: float = 0.20
    # Loss scale collapse: the scale fell below 1, or to 2^-10 of its initial value.
    scale_collapse_abs: float = 1.0
    scale_collapse_ratio: float = 2.0**-10
    # Share of steps the GradScaler skipped (any skip is at least "low").
    skipped_medium: float = 0.05
    skipped_high: float = 0.25
    # Skips persist (more than the scaler's search for its scale, see `skips_persist`): the
    # scale collapsed, or at least this many skips and skipped_high of the steps.
    skips_persist_min: int = 10
    # The scaler's own settings skip (`scaler_config_cause`): at least this many skips right
    # after the scale grew, each at a scale above every scale a step held.
    config_regrowth_min: int = 2
    # Forward output magnitude against FP16's max (65504): overflow, and within 4x of it.
    activation_overflow: float = fp16range.FP16_MAX
    activation_near: float = fp16range.FP16_MAX / 4


THRESHOLDS = Thresholds()

SECTION = "numerics"


def _scale_in_use(session: Session) -> float | None:
    history = session.section("scaler").get("history") or []
    return float(history[-1]["scale"]) if history else None


def _fp16(session: Session) -> bool:
    """Whether the run computes in FP16: the only runs FP16's range is a problem for."""
    return computes_in(session)["precision"] == "fp16"


def _wide_range(session: Session, device: str) -> str | None:
    """The precision that gives FP16's values FP32's exponent range, as advice names it.

    BF16; FP32 on a CPU that emulates BF16 (slower than FP32 there: `pc.fp32_fast_here`);
    None where BF16 is not advisable (a GPU below compute capability 8.0).
    """
    if pc.fp32_fast_here(session, device) is not None:
        return "fp32"
    return "bf16" if advisable(session.environment, "bf16") else None


def _instead_words(session: Session, device: str, wide: str) -> str:
    """The alternative `_wide_range` names, in a sentence (its setting follows it)."""
    if wide == "bf16":
        return "train in bfloat16 (same exponent range as float32)"
    why = pc.fp32_fast_here(session, device)
    return f"train in FP32 ({why}: FP32 is the fast precision here, with no GradScaler)"


def _instead(session: Session, device: str) -> str | None:
    """The alternative to FP16 with FP32's range, with the run's setting for it (or None)."""
    wide = _wide_range(session, device)
    if wide is None:
        return None
    code = f"torch.autocast('{device}', dtype=torch.bfloat16)" if wide == "bf16" else ""
    setting = terms.precision_setting(session, wide) or code
    return _instead_words(session, device, wide) + (f": {setting}" if setting else "")


@rule("fp16-grad-underflow")
def fp16_grad_underflow(session: Session) -> Iterator[Finding]:
    """FP16 holds >= 5% of nonzero gradient values as zero/subnormal (medium), >= 20% (high).

    Measured where FP32 gradients are cast to FP16 (against the FP32 value, so values flushed
    to zero count), on activation gradients and on parameter gradients, at the loss scale in
    use (`underflow_summary`); only for runs that compute in FP16. When no scale reaches 1%
    (``scale_reaches_target`` False) the fix is BF16.
    """
    dev = device_type(session.environment)
    if not _fp16(session):
        return
    u = derived(session).get("numerics", {}).get("underflow", {})
    frac = u.get("underflow_fraction", 0.0)
    if not u.get("measured") or frac < THRESHOLDS.underflow_medium:
        return
    sev: Severity = "high" if frac >= THRESHOLDS.underflow_high else "medium"
    rec = u["recommended_init_scale"]
    scale = _scale_in_use(session)
    ev = {k: v for k, v in u.items() if k != "measured"}
    ev |= {"scale_in_use": scale if scale is not None else 1.0, "threshold": 0.05}
    wide = _wide_range(session, dev)
    held = None
    if u["scale_reaches_target"] is False and wide is None:
        fix = (
            "No loss scale keeps FP16's underflow under 1% without overflowing other "
            "gradients: they span more than FP16's range, and this GPU has no BF16. Keep the "
            "modules whose gradients fall out of range in FP32:\n" + terms.fp32_module(dev)
        )
    elif wide is not None and u["scale_reaches_target"] is False:
        instead = _instead_words(session, dev, wide)
        fix = (
            "No loss scale keeps FP16's underflow under 1% without overflowing other "
            f"gradients: they span more than FP16's range. T{instead[1:]}:\n"
            + terms.precision_fix(session, wide, terms.training_step(wide, dev))
        )
    else:
        needs = (
            f"smallest scale that keeps underflow under 1%: {rec:g}"
            if rec
            else "the scale needed is unmeasured; torch's default, grown by the scaler"
        )
        held = _scale_held(session, rec)
        if held is not None:
            ev["scale_held_by"] = {"growth_interval": held}
        fix = (
            f"Scale the loss so small gradients stay representable ({needs}):\n"
            + (
                "# growth_interval=2000: the scale grows, it is not held fixed\n"
                if held is not None
                else ""
            )
            + terms.training_step(
                "fp16", dev, init_scale=rec or None, growth_interval=None if held is None else 2000
            )
            + (f"\nor {alt}" if (alt := _instead(session, dev)) else "")
        )
    yield Finding(
        id="fp16-grad-underflow",
        severity=sev,
        title=(
            f"{'At least ' if 'unmeasured' in u else ''}{frac:.1%} of nonzero gradient values "
            f"fall below FP16's normal range (zero or subnormal) at loss scale "
            f"{ev['scale_in_use']:g}"
            + (
                f", where the GradScaler's growth_interval={held} holds it (it never grows)"
                if held is not None
                else ""
            )
            + (" (inside the model unmeasured: no FP32 replay)." if "unmeasured" in u else ".")
        ),
        evidence=ev,
        fix=fix,
        section=SECTION,
        impact=min(1.0, frac),
    )


def _scale_held(session: Session, needed: float | None) -> int | None:
    """The GradScaler's growth_interval where it holds a scale too small fixed, else None.

    A scaler grows only every ``growth_interval`` finite steps: set beyond torch's default
    (2000) and beyond the run's steps, a scale below the one underflow needs never grows --
    the setting, not the model, keeps the gradients lost.
    """
    sc = session.section("scaler")
    info = sc.get("scaler") or {}
    interval = info.get("growth_interval")
    scale = _scale_in_use(session)
    steps = int(sc.get("steps_total", len(sc.get("history") or [])))
    if not (info.get("enabled") and isinstance(interval, (int, float)) and needed and scale):
        return None
    fixed = interval > max(SCALER_DEFAULTS["growth_interval"], steps)
    return int(interval) if fixed and scale < needed else None


@rule("grad-scaler-missing")
def grad_scaler_missing(session: Session) -> Iterator[Finding]:
    """FP16 autocast without any GradScaler (high): small gradients flush to zero."""
    run = session.section("run")
    autocast = run.get("autocast_seen") or {}
    fp16 = {k: v for k, v in autocast.items() if str(k).endswith(":float16")}
    if not fp16 or run.get("scaler") is not None or session.section("scaler").get("present"):
        return
    u = derived(session).get("numerics", {}).get("underflow", {})
    device = str(next(iter(fp16))).split(":")[0]
    rec = u.get("recommended_init_scale")  # None: unmeasured (torch's default in the fix)
    yield Finding(
        id="grad-scaler-missing",
        severity="high",
        title=(
            "FP16 autocast runs without a GradScaler: gradients below 2^-24 (about 0.00000006) "
            "become zero."
        ),
        evidence={
            "autocast_seen": fp16,
            "underflow_fraction": u["underflow_fraction"],
            "recommended_init_scale": rec,
        },
        fix=terms.training_step("fp16", device, init_scale=rec or 2.0**16),
        section=SECTION,
        impact=0.9,
    )


@rule("grad-scaler-disabled")
def grad_scaler_disabled(session: Session) -> Iterator[Finding]:
    """A GradScaler exists but is disabled while the run computes in FP16 (high).

    ``torch.amp.GradScaler()`` defaults to "cuda" and disables itself, with only a warning,
    when the run is on the CPU.
    """
    info = session.section("scaler").get("scaler") or session.section("run").get("scaler")
    if not info or info.get("enabled", True) or not _fp16(session):
        return
    env_device = session.environment.get("device_type") or "cpu"
    scaler_device = info.get("device") or ""
    yield Finding(
        id="grad-scaler-disabled",
        severity="high",
        title=(
            f"The GradScaler is disabled (built for {scaler_device or '?'!s}, run on "
            f"{env_device}): FP16 gradients are not scaled and inf steps are not skipped."
        ),
        evidence={
            "enabled": False,
            "scaler_device": scaler_device,
            "run_device": env_device,
            "underflow_fraction": derived(session)["numerics"]["underflow"]["underflow_fraction"],
        },
        fix=(
            "Build the scaler for the device the run uses, and enabled:\n"
            f'scaler = torch.amp.GradScaler("{env_device}")'
        ),
        section=SECTION,
        impact=0.85,
    )


def _scale_collapse(sc: Mapping[str, Any]) -> tuple[Severity, float, float] | None:
    """(severity, initial scale, smallest scale) when the loss scale collapsed, else None."""
    history = sc.get("history") or []
    if not history:
        return None
    initial = float(history[0]["scale"])
    scales = [float(h["scale"]) for h in history] + [float(h["scale_after"]) for h in history]
    smin = min(scales)
    every_step_min = sc.get("scale_min")  # every step's, where the history is thinned
    if isinstance(every_step_min, (int, float)):
        smin = min(smin, float(every_step_min))
    if smin >= initial:  # it never fell: a scale set small (fixed) underflows, never collapses
        return None
    if smin < THRESHOLDS.scale_collapse_abs:
        return "high", initial, smin
    if smin <= initial * THRESHOLDS.scale_collapse_ratio:
        return "medium", initial, smin
    return None


def skips_persist(session: Session) -> bool:
    """Whether the GradScaler's skips are more than its search for a working scale.

    A scaler halves its scale on each skipped step until the gradients fit: a few skips at the
    start (from torch's default 2^16), or when the gradients grow, then none. Skips persist
    when the scale collapsed (`loss-scale-collapse`'s thresholds: below 1, or at most 2^-10
    of the initial scale -- ten halvings more than it grew) or, for a scaler that backs off
    more gently, when it skipped at least ``skips_persist_min`` (10) steps and at least
    ``skipped_high`` (25%) of them: a gradient that overflows whatever the scale, whose
    origin is then reported.
    """
    sc = session.section("scaler")
    if _scale_collapse(sc) is not None:
        return True
    history = sc.get("history") or []
    if not history or scaler_config_cause(session) is not None:
        return False
    skipped = int(sc.get("skipped_total", len(sc.get("skipped_steps") or [])))
    steps = int(sc.get("steps_total", len(history))) or len(history)
    return skipped >= THRESHOLDS.skips_persist_min and skipped / steps >= THRESHOLDS.skipped_high


#: torch.amp.GradScaler's defaults, which the fix restores.
SCALER_DEFAULTS = {"growth_interval": 2000, "growth_factor": 2.0}


def scaler_config_cause(session: Session) -> dict[str, Any] | None:
    """The evidence that the GradScaler's own settings make it skip, or None.

    A scaler grows its scale every ``growth_interval`` finite steps by ``growth_factor``; when
    the scale grows past what the gradients hold, the step overflows, is skipped and the scale
    backs off -- to grow again ``growth_interval`` steps later. With the default 2000 that is
    one skip in 2000 steps; with 1 it is every other step. The settings are the cause (not a
    model that overflows) when no skipped step ran at a scale below the largest at which a
    step held (so a smaller scale always held), and at least ``config_regrowth_min`` skips
    came right after the scale grew again (not the first search down from ``init_scale``).
    A gradient that overflows whatever the scale skips at scales that held before, or never
    holds at all: not this.
    """
    sc = session.section("scaler")
    info = sc.get("scaler") or {}
    history = [h for h in sc.get("history") or [] if isinstance(h, dict)]
    if not info.get("enabled") or int(sc.get("history_stride") or 1) != 1 or len(history) < 3:
        return None
    skipped = [h for h in history if h.get("skipped")]
    held = [float(h["scale"]) for h in history if not h.get("skipped")]
    if len(skipped) < 2 or not held:
        return None
    ceiling = max(held)
    if min(float(h["scale"]) for h in skipped) < ceiling:
        return None  # it overflowed below a scale that held before: the gradients
    regrown = 0
    for prev, h in itertools.pairwise(history):
        grew = float(h["scale"]) > float(prev["scale"])
        if h.get("skipped") and not prev.get("skipped") and grew:
            regrown += 1
    if regrown < THRESHOLDS.config_regrowth_min:
        return None
    n_skipped = int(sc.get("skipped_total", len(skipped)))
    n_steps = int(sc.get("steps_total", len(history))) or len(history)
    if n_skipped / n_steps < THRESHOLDS.skipped_medium:
        return None
    interval = info.get("growth_interval")
    factor = info.get("growth_factor")
    return {
        "skipped": n_skipped,
        "steps": n_steps,
        "share": round(n_skipped / n_steps, 4),
        "skips_after_growth": regrown,
        "held_scale": ceiling,
        "overflow_scale": min(float(h["scale"]) for h in skipped),
        "growth_interval": interval,
        "growth_factor": factor,
        "backoff_factor": info.get("backoff_factor"),
        "init_scale": info.get("init_scale"),
    }


@rule("grad-scaler-config")
def grad_scaler_config(session: Session) -> Iterator[Finding]:
    """The GradScaler skips because of its own settings, not because the model overflows.

    Medium (>= 5% of steps skipped), high (>= 25%): every skip ran at a scale above every
    scale a step held, and the scale kept growing back into the overflow
    (`scaler_config_cause`). The fix is the scaler's settings -- the defaults, starting at the
    scale that held -- never the precision: FP16 holds this model's gradients.
    """
    ev = scaler_config_cause(session)
    if ev is None:
        return
    sev: Severity = "high" if ev["share"] >= THRESHOLDS.skipped_high else "medium"
    interval, factor = ev.get("growth_interval"), ev.get("growth_factor")
    settings = []
    if isinstance(interval, (int, float)) and interval < SCALER_DEFAULTS["growth_interval"]:
        settings.append(f"growth_interval={int(interval)}")
    if isinstance(factor, (int, float)) and factor > SCALER_DEFAULTS["growth_factor"]:
        settings.append(f"growth_factor={factor:g}")
    named = " and ".join(settings) or "its settings"
    dev = device_type(session.environment)
    yield Finding(
        id="grad-scaler-config",
        severity=sev,
        title=(
            f"The GradScaler's {named} makes it skip {ev['skipped']} of {ev['steps']} steps: "
            f"{ev['skips_after_growth']} times the scale grew back to "
            f"{units.count(ev['overflow_scale'])}, overflowed and backed off, while steps held "
            f"at scales up to {units.count(ev['held_scale'])}. FP16 holds this model's "
            "gradients at such a scale: the scaler's settings make these skips."
        ),
        evidence=ev,
        fix=(
            "Use the GradScaler's default growth (or grow rarely), starting from the scale "
            "that held:\n"
            f"scaler = torch.amp.GradScaler({dev!r}, init_scale={ev['held_scale']:g}, "
            "growth_interval=2000, growth_factor=2.0)"
        ),
        section=SECTION,
        impact=ev["share"],
    )


@rule("loss-scale-collapse")
def loss_scale_collapse(session: Session) -> Iterator[Finding]:
    """The loss scale fell below 1 (high) or to <= 2^-10 of its initial value (medium)."""
    dev = device_type(session.environment)
    sc = session.section("scaler")
    history = sc.get("history") or []
    collapse = _scale_collapse(sc)
    if collapse is None:
        return
    sev, initial, smin = collapse
    backoffs = sc.get("backoff_total", len(sc.get("backoff_steps", [])))
    yield Finding(
        id="loss-scale-collapse",
        severity=sev,
        title=(
            f"The loss scale collapsed from {initial:g} to {smin:g}: the gradients hold "
            "inf/NaN on step after step, whatever the scale."
        ),
        evidence={
            "scale_initial": initial,
            "scale_min": smin,
            "scale_final": float(history[-1]["scale_after"]),
            "backoffs": backoffs,
            "steps": sc.get("steps_total", len(history)),
        },
        fix=(
            "A collapsing scale means a real inf/NaN (not a too-large scale). Find its origin "
            "(see nonfinite-origin), e.g. an overflowing activation or a log/div of 0"
            + (f"; or {alt}." if (alt := _instead(session, dev)) else ".")
        ),
        section=SECTION,
        impact=0.8 if sev == "high" else 0.5,
    )


@rule("skipped-steps")
def skipped_steps(session: Session) -> Iterator[Finding]:
    """The GradScaler skipped steps: >= 25% (high), >= 5% (medium), any (low).

    Not where its own settings made the skips (``grad-scaler-config`` states them instead).
    """
    sc = session.section("scaler")
    history = sc.get("history") or []
    skipped = sc.get("skipped_steps") or []
    if not history or not skipped or scaler_config_cause(session) is not None:
        return  # none, or the scaler's own settings made them (grad-scaler-config)
    # Totals count every step where the history and the step lists are bounded.
    n_skipped = int(sc.get("skipped_total", len(skipped)))
    n_steps = int(sc.get("steps_total", len(history))) or len(history)
    share = n_skipped / n_steps
    sev: Severity = (
        "high"
        if share >= THRESHOLDS.skipped_high
        else "medium"
        if share >= THRESHOLDS.skipped_medium
        else "low"
    )
    yield Finding(
        id="skipped-steps",
        severity=sev,
        title=(
            f"The GradScaler skipped {n_skipped} of {n_steps} steps (inf/NaN in the "
            "gradients): those steps did not update the weights."
        ),
        evidence={
            "skipped": n_skipped,
            "steps": n_steps,
            "share": round(share, 4),
            "first_skipped": skipped[:10],
            "scale_initial": float(history[0]["scale"]),
        },
        fix=(
            "A few skips at the start are the scaler finding its scale; start lower to avoid "
            "them: torch.amp.GradScaler(init_scale=2.**12). Skips all along mean a real "
            "overflow: see activation-overflow / nonfinite-origin"
            + (", or use bfloat16." if advisable(session.environment, "bf16") else ".")
        ),
        section=SECTION,
        impact=share,
    )


@rule("activation-overflow")
def activation_overflow(session: Session) -> Iterator[Finding]:
    """A module's output reaches FP16's max 65504, or comes within 4x of it (low).

    High in FP16 runs. In a BF16 or FP32 run the value is representable: the figure is only
    what FP16 would do, so it is an info what-if, never the run's problem.
    """
    dev = device_type(session.environment)
    modules = [
        m
        for m in session.section("activations").get("modules", [])
        # An inf output is the NaN/inf origin's business (nonfinite-origin names it).
        if isinstance(m.get("max_abs"), (int, float)) and m["max_abs"] != float("inf")
    ]
    if not modules:
        return
    # Ties (a container repeats its last child's output): the innermost module.
    top = max(modules, key=lambda m: (m["max_abs"], str(m["module"]).count(".")))
    peak = float(top["max_abs"])
    fp16 = _fp16(session)
    if peak >= THRESHOLDS.activation_overflow:
        sev: Severity = "high" if fp16 else "medium"
    elif peak >= THRESHOLDS.activation_near:
        sev = "low"
    else:
        return
    if not fp16:
        sev = "info"
    near = sorted(
        (m for m in modules if m["max_abs"] >= THRESHOLDS.activation_near),
        key=lambda m: -m["max_abs"],
    )
    what = "overflows" if peak >= fp16range.FP16_MAX else "comes within 4x of"
    yield Finding(
        id="activation-overflow",
        severity=sev,
        title=(
            f"The output of {top['module']} reaches |x| = {peak:.4g}: it {what} FP16's max "
            f"(65504){'' if fp16 else ' if this run used FP16 (what-if; fine in this run)'}."
        ),
        evidence={
            "module": top["module"],
            "max_abs": peak,
            "fp16_max": fp16range.FP16_MAX,
            "output_dtype": top.get("output_dtype"),
            "fp16_in_use": fp16,
            "modules_near_limit": [m["module"] for m in near[:10]],
        },
        # A what-if advises nothing: the run's own precision holds the value.
        fix=(
            "Keep that module's computation in float32:\n"
            + terms.fp32_module(dev)
            + "\nor normalize/scale its input (e.g. a LayerNorm before it)"
            + (f", or {alt}." if (alt := _instead(session, dev)) else ".")
        )
        if fp16
        else "",
        section=SECTION,
        impact={"high": 0.7, "info": 0.0}.get(sev, 0.3),
    )


def _nonfinite_origin(session: Session) -> tuple[dict[str, Any], int] | None:
    """The origin to report and the number of steps that held inf/NaN, or None.

    The sentinel (every step) is exact; the activations collector's sampled origin is the
    fallback for sessions without it. A forward or loss origin always counts; a backward-only
    origin not when an enabled GradScaler skipped every such step (that is the scaler finding
    its scale, not a fault) -- unless the skips persist (`skips_persist`: the gradient
    overflows whatever the scale, and its origin is the cause). Of the two, the earlier step
    is the origin.
    """
    sc = session.section("scaler")
    enabled = bool((sc.get("scaler") or {}).get("enabled")) and not skips_persist(session)
    skipped = set(sc.get("skipped_steps") or [])
    sentinel = session.section("sentinel")
    if sentinel:
        count = int(sentinel.get("nonfinite_step_count") or 0)
        found: list[dict[str, Any]] = []
        forward = sentinel.get("forward_origin")
        if forward:
            found.append(dict(forward))
        backward = sentinel.get("backward_origin")
        bad = sentinel.get("backward_only_steps") or []
        if backward and not (enabled and all(s in skipped for s in bad)):
            found.append(dict(backward))
        if not found:
            return None
        first = min(found, key=lambda o: int(o["step"]))
        exact = session.section("activations").get("nonfinite_origin")
        if first.get("reproduced") is False and exact and exact.get("step") == first["step"]:
            first = dict(exact)  # the replay stayed finite; that step was sampled: hooks saw it
        replay = sentinel.get("replay") or {}
        located = divergence.replayed_origin(replay)
        if (
            located
            and replay.get("step") == first["step"]
            and divergence.is_wrapper_name(first.get("module"))
        ):
            # a compiled model, seen whole by the sentinel: the eager replay names the submodule
            first = {
                **first,
                **located,
                "parent_code": False,
                "located_by": "eager replay of the compiled model",
            }
        return first, count
    acts = session.section("activations")
    origin = acts.get("nonfinite_origin")
    if not origin:
        return None
    bad_steps = acts.get("nonfinite_steps") or [origin["step"]]
    if origin["phase"] == "backward" and enabled and all(s in skipped for s in bad_steps):
        return None
    return dict(origin), len(bad_steps)


def origin_where(origin: dict[str, Any]) -> str:
    """Where an origin lies, in words: "the output of X", "the code of X between A and B"..."""
    module = origin["module"]
    if module == "(loss)":
        return "the loss" if origin["phase"] == "loss" else "the gradient from the loss"
    if not origin.get("parent_code"):
        return f"the {origin['kind']} of {module}"
    before, after = [*(origin.get("between") or []), None, None][:2]
    backward = " (backward)" if origin["phase"] == "backward" else ""
    if before and after:
        return f"the code of {module}{backward} between {before} and {after}"
    if before:
        return f"the code of {module}{backward} after {before}"
    if after:
        return f"the code of {module}{backward} before {after}"
    return f"the code of {module}{backward}"


@rule("nonfinite-origin")
def nonfinite_origin(session: Session) -> Iterator[Finding]:
    """Where inf/NaN first appeared: a module's output or the loss (high), or the backward.

    Forward: the deepest module whose input was finite and whose output is not, or -- when
    the value was already non-finite where a child began -- the parent's own code between
    two children (``parent_code``, ``between``: the child before, the child after; names or
    None). In the backward (medium): the module whose output gradient was finite and input
    gradient is not, or likewise a parent's code. Backward-only inf/NaN is not reported when
    an enabled GradScaler skipped every such step, unless the skips persist
    (`skips_persist`: then the overflowing gradient's origin is the skips' cause).
    Where the sentinel replayed the step in FP32 (``fp32_replay_finite``) and it is non-finite
    there too, or the divergence's cause is not the precision, the fix says so and gives no
    float32 advice (`_origin_fix`).
    """
    dev = device_type(session.environment)
    found = _nonfinite_origin(session)
    if found is None:
        return
    origin, count = found
    fp32 = _replayed_fp32(session, int(origin["step"]))
    sev: Severity = "medium" if origin["phase"] == "backward" else "high"
    where = origin_where(origin)
    parent_code = bool(origin.get("parent_code"))
    evidence = {
        **{k: origin[k] for k in ("step", "module", "phase", "kind")},
        "parent_code": parent_code,
        "where": where,
        "steps_with_nonfinite": count,
        "dtype": DTYPES[computes_in(session)["precision"]],
    }
    if parent_code:
        evidence["between"] = list(origin.get("between") or [None, None])
    title = f"inf/NaN first appears at step {origin['step']} in {where}."
    if origin.get("reproduced") is False:
        evidence["reproduced"] = False
        title += " Its replay stayed finite: the module that made it is not known."
    if origin.get("located_by"):
        evidence["located_by"] = origin["located_by"]
    if fp32:
        evidence["fp32_replay_finite"] = fp32["finite"]
    if origin["phase"] == "backward" and skips_persist(session):
        sc = session.section("scaler")
        evidence["skipped"] = int(sc.get("skipped_total", len(sc.get("skipped_steps") or [])))
    yield Finding(
        id="nonfinite-origin",
        severity=sev,
        title=title,
        evidence=evidence,
        fix=_origin_fix(session, origin, fp32, dev),
        section=SECTION,
        impact=0.95 if sev == "high" else 0.6,
    )


def _origin_fix(
    session: Session, origin: dict[str, Any], fp32: dict[str, Any] | None, dev: str
) -> str:
    """The fix for where inf/NaN first appeared, fitting its measured cause.

    Float32 advice only where float32 can help: not where the divergence's cause is
    measured not to be the precision (`divergence.assess`: the run computes in FP32, the FP32
    replay of the step is non-finite too, or the loss was already blowing up -- then the
    values grew until they left the range at this module, and the fix is the learning rate,
    not this op), and not in a run that computes in FP32.
    """
    module, step = origin["module"], origin["step"]
    div: DivergenceResult = derived(session).get("divergence", DivergenceResult(steps=0))
    why = div.get("cause", {})
    inspect = (
        f"Inspect {module} at step {step}: a division by ~0, log of 0, sqrt of 0 in the "
        "backward, exp/softmax of large values, or a non-finite input."
    )
    guard = "Guard the op:\ny = x / d.clamp_min(1e-6); y = torch.log(x.clamp_min(1e-6))"
    if why.get("cause") == "not-precision":
        if div.get("trend", {"steps": 0}).get("exploding"):
            return (
                f"{module} is where the run's growing values first left the range "
                f"({why.get('why')}): not this op's fault -- the updates are too large. "
                "Lower the learning rate, warm it up and clip the gradients (the divergence's fix)."
            )
        return f"{inspect} Not the precision ({why.get('why')}). {guard}"
    if why.get("kind") == "low-precision-update":
        return (
            f"{module} is where the non-finite weights first showed ({why.get('why')}). Keep "
            "FP32 weights for the optimizer (model.float(), autocast for the compute): see "
            "the divergence's fix."
        )
    if fp32 and fp32["finite"] is False and why.get("cause") != "precision":
        return (
            f"{inspect} The FP32 replay of the step is non-finite too: not the precision. {guard}"
        )
    if computes_in(session)["precision"] == "fp32":
        return f"{inspect} The run computes in FP32: not the precision. {guard}"
    return (
        f"Inspect {module} at step {step}: a division by ~0, log of 0, sqrt of 0 in the "
        "backward, exp/softmax of large values"
        + (", or an FP16 overflow" if _fp16(session) else "")
        + ". Compute it in float32:\n"
        + terms.fp32_module(dev)
        + "\nor add an epsilon (x / (d + 1e-6), torch.log(x.clamp_min(1e-6)))."
    )


def _replayed_fp32(session: Session, step: int) -> dict[str, Any] | None:
    """The sentinel's FP32 replay of ``step`` (`divergence_replay`), where it ran."""
    replay = session.section("sentinel").get("replay") or {}
    fp32 = (replay.get("results") or {}).get("fp32") or {}
    return fp32 if replay.get("step") == step and isinstance(fp32.get("finite"), bool) else None


@rule("clip-before-unscale")
def clip_before_unscale(session: Session) -> Iterator[Finding]:
    """Gradient clipping ran on still-scaled gradients (high).

    The clip threshold is compared against S·|g|, so it clips almost always and far too hard.
    """
    events = [e for e in session.section("scaler").get("clip_events", []) if e["grads_scaled"]]
    if not events:
        return
    e = events[0]
    yield Finding(
        id="clip-before-unscale",
        severity="high",
        title=(
            f"{e['function']} ran on gradients still multiplied by the loss scale "
            f"({e['scale']:g}), in {len(events)} step(s)."
        ),
        evidence={
            "clips_on_scaled_grads": len(events),
            "first_step": e["step"],
            "limit": e["limit"],
            "total_norm_seen": e["total_norm"],
            "scale": e["scale"],
        },
        fix=(
            "Unscale before clipping:\n"
            "scaler.scale(loss).backward()\n"
            "scaler.unscale_(optimizer)\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
            "scaler.step(optimizer)\n"
            "scaler.update()"
        ),
        section=SECTION,
        impact=0.8,
    )


@rule("scaler-step-bypassed")
def scaler_step_bypassed(session: Session) -> Iterator[Finding]:
    """optimizer.step() called directly while an enabled GradScaler scales the loss (high).

    The weights are updated with scaled gradients and inf steps are not skipped.
    """
    steps = session.section("scaler").get("bypassed_steps") or []
    if not steps:
        return
    yield Finding(
        id="scaler-step-bypassed",
        severity="high",
        title=(
            f"optimizer.step() bypassed scaler.step() in {len(steps)} step(s): "
            "the update used scaled (or inf) gradients."
        ),
        evidence={"bypassed": len(steps), "first_steps": steps[:10]},
        fix=(
            "Step through the scaler:\nscaler.step(optimizer)  # not optimizer.step()\n"
            "scaler.update()"
        ),
        section=SECTION,
        impact=0.85,
    )
