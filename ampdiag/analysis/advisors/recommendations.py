"""Recommendations computed from several findings at once (`ampdiag.analysis.advisors`).

Each advisor reads the findings the rules produced (by their stable ids and documented evidence
keys) and the session's environment, and returns one recommendation with the numbers it rests
on, merging the findings it explains:

========================  ==================================================================
recommendation            evidence it merges (``explains``)
========================  ==================================================================
prefer-bf16, prefer-fp32, the precision A/B (``speed_probe.precisions``) chose another
prefer-fp16               precision than the run's: autocast-slower, and the FP16 findings
                          below when the run leaves FP16
prefer-bf16               (A/B not measured) fp16-grad-underflow, grad-scaler-missing,
                          grad-scaler-disabled, skipped-steps, loss-scale-collapse,
                          activation-overflow, nonfinite-origin -- on a device that runs BF16
tune-grad-scaler          the same less the forward-range ones, where FP16 stays: a device
                          without BF16, or the A/B measured FP16 alone the fastest safe
use-grad-accumulation     memory-near-capacity (activations >= 50% of the peak)
tune-input-pipeline       dataloader-bound, gpu-idle (the idle time is the data wait)
increase-batch-size       gpu-idle, launch-bound (no data wait, memory not near capacity)
========================  ==================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ampdiag import units
from ampdiag.analysis import device
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.advisors import Advice, advisor, find, number, terms, worst_severity
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.derive import derived
from ampdiag.analysis.rules.accumulation import accumulation_broken
from ampdiag.analysis.rules.memory import accumulation_fix
from ampdiag.schema import DivergenceResult
from ampdiag.session import Finding, Session


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # tune-grad-scaler: skips per step beyond the start-up backoff that are tolerated; the
    # recommended growth_interval keeps growth-caused skips at this rate (1 / rate).
    target_skip_rate: float = 0.0005
    # tune-grad-scaler: growth_interval when gradients underflow and nothing overflows, so the
    # scale follows gradients that shrink during training 4x faster than the default 2000.
    growth_interval_underflow: int = 500
    # use-grad-accumulation: activations must be at least this share of the peak.
    activation_share_min: float = 0.5
    # use-grad-accumulation / increase-batch-size: keep the peak under (1 - headroom) x capacity.
    memory_headroom: float = 0.15
    # prefer-<precision> from the A/B on speed alone (not merged with worse findings): medium
    # when the lower end of the speed-up over the run's own precision is at least this, and
    # never high: how large a speed-up measures moves between identical runs of a loaded
    # machine (one 1.74x gain measured 1.40x-1.75x in four processes), so a second line on it
    # made the severity flip. Its size is the title's figure and the finding's impact.
    switch_speedup_medium: float = 1.10
    # tune-input-pipeline: worker count bounds.
    num_workers_min: int = 2
    num_workers_max: int = 16
    # increase-batch-size: the idle share to reach, and the largest batch multiplier advised.
    target_idle_share: float = 0.10
    batch_multiplier_max: int = 8


THRESHOLDS = Thresholds()

FP16_UNDERFLOW = "fp16-grad-underflow"
SCALER_MISUSE = ("grad-scaler-missing", "grad-scaler-disabled")
SCALE_TROUBLE = ("skipped-steps", "loss-scale-collapse")
RANGE_TROUBLE = ("activation-overflow", "nonfinite-origin")
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_INTERVAL = 2000


def _actionable(findings: list[Finding], *ids: str) -> list[Finding]:
    return [f for f in find(findings, *ids) if f.severity != "info"]


def bf16_supported(session: Session) -> bool | None:
    """Whether the run's device runs BF16: True, False, or None when the session cannot say.

    A GPU's compute capability decides where the session has it (`device.runs_bf16`: 8.0 and
    later): below, torch emulates BF16 and ``torch.cuda.is_bf16_supported()`` still says True.
    """
    env = session.environment
    known = device.runs_bf16(env)
    if known is not None:
        return known
    value = env.get("bf16_supported")
    return value if isinstance(value, bool) else None


def batch_size(session: Session, *findings: Finding) -> int | None:
    """The batch size from evidence, the memory section or the speed probe, if any records it."""
    candidates: list[Any] = [f.evidence.get("batch_size") for f in findings]
    candidates.append(session.section("memory").get("observed_batch"))
    candidates.append(session.section("speed_probe").get("batch_size"))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _pow2_ceil(x: float) -> float:
    return float(2.0 ** math.ceil(math.log2(max(x, 1.0))))


def _pow2_floor(x: float) -> float:
    return float(2.0 ** math.floor(math.log2(max(x, 1.0))))


def _fp16_evidence(merged: list[Finding]) -> dict[str, Any]:
    """The key numbers of the merged FP16 findings, flattened under their documented keys."""
    out: dict[str, Any] = {}
    keys = {
        FP16_UNDERFLOW: ("underflow_fraction", "recommended_init_scale"),
        "skipped-steps": ("skipped", "steps"),
        "loss-scale-collapse": ("scale_initial", "scale_min"),
        "activation-overflow": ("module", "max_abs"),
    }
    for f in merged:
        for key in keys.get(f.id, ()):
            if key in f.evidence and key not in out:
                out[key] = f.evidence[key]
    return out


def loss_flat(session: Session) -> str | None:
    """The words "the loss did not fall in N steps (A at the start, B at the end)", or None.

    The median finite loss of the first and of the last tenth of the steps (20 steps at
    least, so one noisy step decides nothing): flat when the end is above 98% of the start.
    """
    values = (s.get("loss") for s in session.steps)
    losses = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(losses) < 20:
        return None
    k = max(2, len(losses) // 10)
    first, last = sorted(losses[:k])[k // 2], sorted(losses[-k:])[k // 2]
    if first <= 0 or last < 0.98 * first:
        return None
    return (
        f"the loss did not fall in {len(losses)} steps ({first:.2f} at the start, "
        f"{last:.2f} at the end)"
    )


def consequence(session: Session, trouble: list[Finding]) -> str:
    """The most severe measured consequence of the FP16 trouble, in words (the advice's lead).

    Lost gradients first (with the flat loss when the run measured one), then inf/NaN, skipped
    steps, a collapsed loss scale, overflowing activations, a missing GradScaler.
    """
    by_id = {f.id: f for f in trouble}
    clauses: list[str] = []
    under = by_id.get(FP16_UNDERFLOW)
    fraction = number(under.evidence, "underflow_fraction") if under else None
    if fraction is not None:
        scaled = number(under.evidence, "scale_in_use") if under else None
        how = (
            "without loss scaling"
            if not scaled or scaled == 1
            else f"at loss scale {units.count(scaled) if scaled > 1 else f'{scaled:g}'}"
        )
        clauses.append(f"{fraction:.1%} of the gradient values are lost to underflow in FP16 {how}")
        flat = loss_flat(session)
        if flat:
            clauses.append(flat)
    elif "nonfinite-origin" in by_id:
        module = by_id["nonfinite-origin"].evidence.get("module")
        clauses.append("inf/NaN appeared" + (f" first in {module}" if module else ""))
    elif "skipped-steps" in by_id:
        ev = by_id["skipped-steps"].evidence
        clauses.append(f"the GradScaler skipped {ev.get('skipped')} of {ev.get('steps')} steps")
    elif "loss-scale-collapse" in by_id:
        low = number(by_id["loss-scale-collapse"].evidence, "scale_min") or 0
        clauses.append(f"the loss scale collapsed to {units.count(low)}")
    elif "activation-overflow" in by_id:
        module = by_id["activation-overflow"].evidence.get("module")
        clauses.append(f"activations near FP16's limit in {module}")
    elif SCALER_MISUSE[0] in by_id or SCALER_MISUSE[1] in by_id:
        clauses.append("FP16 runs without a working GradScaler: small gradients become zero")
    return "; ".join(clauses) or f"{len(trouble)} FP16 range problem(s)"


@advisor("prefer-bf16", "prefer-fp32", "prefer-fp16", "tune-grad-scaler")
def precision_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """One precision advice, from the A/B measurements when there are any.

    **Measured** (the run's A/B timed its precisions, `precision_choice.measured`): the choice
    is the A/B's own (`precision_choice.choose` with the run's precision kept unless a safe one
    is measured clearly faster: the lower end of its speed-up interval at least
    `precision_choice.SWITCH_SPEEDUP`), so the advice and the A/B's ``recommended`` agree.

    - The A/B keeps the run's precision: no switch is advised (and ``autocast-slower``, if the
      quick probe saw a slowdown, is reported as uncertain).
    - Else ``prefer-<choice>`` (bf16, fp32 -- also for TF32 matmuls -- or fp16) with the
      measured speed-up over the run's precision (the ratio of the least times and the range
      the intervals allow, `precision_choice.TIMING`),
      the activation memory it saves and its error against FP32; it merges
      ``autocast-slower`` and, when the run leaves FP16, the FP16 findings, whose measured
      consequence then leads its title (`consequence`: "99.8% of the gradient values are lost
      to underflow in FP16 without loss scaling; the loss did not fall in 100 steps ...") and
      its ``evidence.consequence`` is "numerics" (else "speed": `ampdiag.analysis.verdict`).
      Its own severity: medium when the speed-up's lower end is >= 1.1x, high when its ratio
      of least times is also >= 1.5x; at
      least that of the FP16 findings it leaves.
    - An FP16 run with FP16 trouble whose A/B keeps FP16 (measured safe with a GradScaler's
      loss scale): ``tune-grad-scaler``.

    **Not precision** (`ampdiag.analysis.divergence`: the first non-finite step is
    non-finite in the FP32 replay too, or the loss was already exploding, or the run is
    FP32): a run that diverged or stalled gets no precision advice at all; one that recovered
    loses that step's ``nonfinite-origin`` (and the skips of those steps) from its evidence.

    **Not measured** (no A/B: a trace, a skipped probe, each precision timed once): the rules
    of before, which say so (``measured`` False, ``not_measured`` why):

    prefer-bf16: any of fp16-grad-underflow, grad-scaler-missing/-disabled, skipped-steps,
    loss-scale-collapse, activation-overflow, nonfinite-origin (not info) on a device with
    ``environment.bf16_supported`` (CUDA capability >= 8.0; any CPU). BF16 has FP32's
    exponent range: no underflow at 2^-24, no overflow at 65504, no GradScaler needed.
    Neither is advised to a run that does not compute in FP16 (`computes_in`).

    tune-grad-scaler: the same evidence (less the forward-range findings, which no loss scale
    fixes) where BF16 is not supported or unknown. ``init_scale`` = the underflow finding's
    ``recommended_init_scale`` rounded up to a power of two, capped by the lowest scale the run
    backed off to (``scale_min``: above it, gradients overflowed); when the underflow bound is
    above the overflow bound FP16's range is too narrow (``range_conflict``).
    ``growth_interval`` = 1 / target_skip_rate (2000) when the run skipped steps beyond the
    start-up backoff (log2(scale_initial / scale_min) skips), 500 when gradients underflow and
    nothing overflows, else torch's default 2000.
    """
    scaler_ids = (FP16_UNDERFLOW, *SCALER_MISUSE, *SCALE_TROUBLE)
    fp16_run = computes_in(session)["precision"] == "fp16"
    trouble = _actionable(findings, *scaler_ids, *RANGE_TROUBLE) if fp16_run else []
    div = derived(session).get("divergence", DivergenceResult(steps=0))
    if div.get("cause", {}).get("cause") == "not-precision":
        if div.get("verdict") in ("diverged", "stalled"):
            return  # no precision fixes it, and the A/B ran on weights the run lost
        trouble = _not_that_event(trouble, div)
    ab = pc.measured(session)
    if ab.choice is not None and ab.run is not None:
        yield from _measured_advice(session, findings, ab, trouble)
        return
    not_measured = {"measured": False, "not_measured": ab.why_not}
    env = session.environment
    dev = device.device_type(session.environment)
    slower = [f for f in find(findings, "autocast-slower") if f.severity != "info"]
    if not trouble:
        if slower:  # the probe's slowdown alone: its own fix's choice, as a recommendation
            yield Advice(_unmeasured_switch(session, ab, slower[0]), slower[:1])
        return
    bf16 = bf16_supported(session)
    if bf16:
        evidence: dict[str, Any] = {
            "autocast": env.get("autocast"),
            "device_type": dev,
            "bf16_supported": True,
        }
        evidence.update(_fp16_evidence(trouble))
        evidence.update(not_measured)
        caveat = ""
        if dev == "cpu" and env.get("bf16_native") is False:
            evidence["bf16_native"] = False
            caveat = (
                "\n# This CPU has no native BF16 (no AVX512_BF16/AMX): BF16 runs emulated and can"
                "\n# be slower than FP32, the fast exact option here."
            )
        evidence["consequence"] = "numerics"
        rec = Finding(
            id="prefer-bf16",
            severity=worst_severity(trouble),  # type: ignore[arg-type]
            title=(
                f"{_capital(consequence(session, trouble))}: train in BF16 instead of FP16 "
                f"(this {dev} device runs BF16, whose FP32-sized exponent range has no such loss)."
            ),
            evidence=evidence,
            fix=terms.precision_fix(session, "bf16", terms.training_step("bf16", dev)) + caveat,
            section="precision",
            impact=min(1.0, 0.6 + 0.1 * len(trouble)),
        )
        # autocast-slower's fix names BF16 too where BF16 runs natively: one finding, one code
        agrees = slower if pc.bf16_runs_natively(env, dev) else []
        yield Advice(rec, [*trouble, *agrees])
        return
    merged = _actionable(findings, *scaler_ids)
    if not merged:
        return
    rec = _grad_scaler_settings(session, merged, bf16)
    rec.evidence.update(not_measured)
    yield Advice(rec, merged)


def _not_that_event(trouble: list[Finding], div: DivergenceResult) -> list[Finding]:
    """The FP16 trouble less what a non-finite step precision did not cause explains.

    Its ``nonfinite-origin``, and the GradScaler's skips when they are no more than the steps
    whose loss was non-finite (the scaler skipped exactly those).
    """
    bad = int(div.get("loss_nonfinite_steps") or 0)
    skips = int(div.get("skipped_steps") or 0)
    drop = {"nonfinite-origin", *(["skipped-steps"] if skips <= max(bad, 1) else [])}
    return [f for f in trouble if f.id not in drop]


def _unmeasured_switch(session: Session, ab: pc.Measured, slower: Finding) -> Finding:
    """``autocast-slower`` without an A/B: the precision its fix names, said not measured.

    The same recommendation (id and severity) the A/B gives in the usual case, so that a run
    whose A/B got one timing round and one that got several do not read differently: BF16
    for an FP16 run on a device with native BF16, else FP32. It explains ``autocast-slower``
    (merged, as the A/B's advice does), whose fix names the same choice: one finding, one code.
    """
    dev = device.device_type(session.environment)
    target = (
        "bf16" if ab.run == "fp16" and pc.bf16_runs_natively(session.environment, dev) else "fp32"
    )
    name, run_name = pc.NAMES[target], pc.NAMES.get(ab.run or "", "mixed precision")
    return Finding(
        id=f"prefer-{target}",
        severity=slower.severity,
        title=(
            f"Train in {name} instead of {run_name}: the speed probe measured {run_name} "
            f"{number(slower.evidence, 'slowdown') or 0:.2f}x slower than FP32"
            + (" and this device runs BF16 natively" if target == "bf16" else "")
            + "; the precisions were not compared (see the evidence)."
        ),
        evidence={
            "measured": False,
            "not_measured": ab.why_not,
            "precision": target,
            "run_precision": ab.run,
        },
        fix=terms.precision_fix(session, target, terms.training_step(target, dev)),
        section="precision",
        impact=slower.impact,
    )


def _measured_advice(
    session: Session, findings: list[Finding], ab: pc.Measured, trouble: list[Finding]
) -> Iterator[Advice]:
    """The advice when the A/B measured the precisions (see `precision_advice`).

    The A/B's own choice, never another: the top finding and the A/B's ``recommended`` agree.
    An FP16 run with FP16 trouble whose A/B keeps FP16 (measured safe with a GradScaler's loss
    scale, and nothing else clearly faster) gets ``tune-grad-scaler``; one that leaves FP16
    leads with what FP16 costs it (`consequence`) and explains ``grad-scaler-config`` too.
    """
    choice, run = ab.choice, ab.run
    assert choice is not None and run is not None
    slower = find(findings, "autocast-slower")
    target = choice.precision
    if target == run:
        if trouble and run == "fp16":
            merged = _actionable(findings, FP16_UNDERFLOW, *SCALER_MISUSE, *SCALE_TROUBLE)
            if merged:
                rec = _grad_scaler_settings(session, merged, bf16_supported(session))
                rec.evidence.update(_measured_evidence(ab, "fp16"))
                rec.evidence["compared"] = _vs(ab, "fp16")
                yield Advice(rec, merged)
        return
    numerics = trouble if run == "fp16" else []
    # a GradScaler setting is moot once the run leaves FP16: its fix (keep FP16, set the
    # scaler) is shown under the switch, not beside it as a second, contrary piece of advice
    config = _actionable(findings, "grad-scaler-config") if run == "fp16" else []
    explains = [*slower, *numerics, *config]
    yield Advice(_switch(session, ab, target, explains, numerics), explains)


def _vs(ab: pc.Measured, precision: str) -> str:
    """The other precisions' measured times against ``precision``'s, in words."""
    own = ab.rows.get(precision, {})
    parts = []
    for name, row in ab.rows.items():
        ratio = pc.speedup(row, own) if name != precision else None
        if ratio is None:
            continue
        parts.append(f"{pc.NAMES.get(name, name)} {ratio['median']:.2f}x its time")
    parts += [f"{pc.NAMES.get(n, n)} not timed (over the A/B's budget)"
              for n, r in ab.rows.items() if r.get("not_timed")]  # fmt: skip
    parts += [f"{pc.NAMES.get(n, n)} {r['not_run']}"
              for n, r in ab.rows.items() if r.get("not_run")]  # fmt: skip
    return ", ".join(parts) or "nothing else was timed"


def _measured_evidence(ab: pc.Measured, target: str) -> dict[str, Any]:
    """What every advice resting on the A/B cites: the choice, the rows, the safety rule."""
    assert ab.choice is not None
    return {
        "measured": True,
        "precision": target,
        "run_precision": ab.run,
        "tied": ab.choice.tied,
        "uncertain": ab.choice.uncertain,
        "safety": dict(pc.SAFETY),
        "times_ms": {
            p: [r.get("time_ms"), r.get("time_spread_ms")]
            for p, r in ab.rows.items()
            if r.get("time_ms") is not None
        },
        "unsafe": ab.choice.unsafe,
        "timing": pc.timing_words(ab.rows),
        **{
            key: {p: r[key] for p, r in ab.rows.items() if r.get(key)}
            for key in ("not_timed", "not_run")
            if any(r.get(key) for r in ab.rows.values())
        },
    }


def _switch(
    session: Session,
    ab: pc.Measured,
    target: str,
    explains: list[Finding],
    numerics: list[Finding] | None = None,
) -> Finding:
    """``prefer-<target>``: the measured choice against the run's own precision.

    Its lead is the numerics the run's precision loses (``numerics``, `consequence`) when
    there are any, else the measured speed-up. Every number in the title points the way its
    words say: "FP32 is 1.3x the time of FP16" is said as such, never as "0.76x the speed".
    """
    assert ab.run is not None and ab.choice is not None
    dev = device.device_type(session.environment)
    row, own = ab.rows[target], ab.rows.get(ab.run, {})
    evidence = _measured_evidence(ab, target)
    ratio = pc.speedup(own, row)
    saving = pc.saving(own, row, "saved_bytes")
    name, run_name = pc.NAMES.get(target, target), pc.NAMES.get(ab.run, ab.run)
    claims = []
    severity = "info"
    if ratio is not None:
        evidence["speedup_vs_run"] = {k: round(v, 3) for k, v in ratio.items()}
        claims.append(_speed_words(ratio, name, run_name))
        low = ratio.get("low")
        if low is not None and low >= THRESHOLDS.switch_speedup_medium:
            severity = "medium"
    if saving is not None:
        evidence["activation_saving_vs_run"] = round(saving, 4)
        if abs(saving) >= 0.05:
            claims.append(f"{abs(saving):.0%} {'less' if saving > 0 else 'more'} activation memory")
    peak = pc.saving(own, row, "peak_bytes")
    if peak is not None:
        evidence["peak_saving_vs_run"] = round(peak, 4)
    lead = ""
    if numerics:
        lead = _capital(consequence(session, numerics)) + ". "
        evidence["consequence"] = "numerics"
        severity = worst_severity(numerics)  # the merge raises it to the speed claim's, if worse
    elif pc.is_safe(own) is False:
        reasons = ", ".join(pc.unsafe_reasons(own))
        claims.append(f"{run_name} is not numerically safe here ({reasons})")
        severity = "medium" if severity in ("info", "low") else severity
        evidence["consequence"] = "numerics"
    else:
        evidence["consequence"] = "speed"
    for key in ("loss_rel_diff", "grad_sqnr_db_median", "grad_underflow"):
        if row.get(key) is not None:
            evidence[key] = row.get(key)
    # The target's own safety, said as its own clause: a bare ", numerically safe" after
    # "BF16 is not numerically safe here" read as a contradiction. FP32 is the yardstick the
    # others are checked against, so nothing is said of it.
    if target != "fp32" and pc.is_safe(row):
        claims.append(f"{name} is numerically safe here")
    evidence["compared"] = _vs(ab, target)
    if ab.choice.uncertain and target == ab.choice.precision:
        evidence["tie"] = pc.tie_break(ab.choice, ab.run)
    train = f"Train in {name} instead of {run_name}"
    return Finding(
        id=f"prefer-{'fp32' if target == 'tf32' else target}",
        severity=severity,  # type: ignore[arg-type]
        title=(
            f"{lead}{train}: measured on this model and batch, "
            + "; ".join(claims or ["as fast, within the measured spread"])
            + "."
        ),
        evidence=evidence,
        fix=terms.precision_fix(session, target, terms.training_step(target, dev)),
        section="precision",
        impact=max(0.0, 1 - 1 / ratio["median"]) if ratio else 0.0,
    )


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _speed_words(ratio: dict[str, float], name: str, run_name: str) -> str:
    """``name``'s measured speed against ``run_name``'s, in words that point its way.

    Faster only when the whole interval is above 1, slower only when it is below; else "as
    fast, within the measured spread", with the figures.
    """
    med, low, high = ratio["median"], ratio.get("low"), ratio.get("high")
    span = f", {low:.2f}x-{high:.2f}x" if low is not None and high is not None else ""
    if low is not None and low > 1:
        return f"{name} {med:.2f}x the speed of {run_name}{span}"
    if high is not None and high < 1:
        return f"{name} {1 / med:.2f}x the time of {run_name} (slower{span} the speed)"
    return f"{name} as fast as {run_name} within the measured spread ({med:.2f}x{span})"


def _grad_scaler_settings(session: Session, merged: list[Finding], bf16: bool | None) -> Finding:
    by_id = {f.id: f for f in merged}
    under = by_id.get(FP16_UNDERFLOW)
    collapse = by_id.get("loss-scale-collapse")
    skips = by_id.get("skipped-steps")
    rec_scale = number(under.evidence, "recommended_init_scale") if under else None
    scale_min = number(collapse.evidence, "scale_min") if collapse else None
    scale_initial = number(collapse.evidence, "scale_initial") if collapse else None
    upper = _pow2_floor(scale_min) if scale_min else None
    conflict = bool(rec_scale and upper and _pow2_ceil(rec_scale) > upper)
    if rec_scale and not conflict:
        init_scale = _pow2_ceil(rec_scale)
    elif upper:
        init_scale = upper
    else:
        init_scale = DEFAULT_INIT_SCALE
    skipped = number(skips.evidence, "skipped") if skips else None
    steps = number(skips.evidence, "steps") if skips else None
    startup = 0
    if scale_initial and scale_min and scale_initial > scale_min:
        startup = round(math.log2(scale_initial / scale_min))
    steady = max(0.0, (skipped or 0.0) - startup)
    evidence: dict[str, Any] = {
        "init_scale": init_scale,
        "growth_interval": DEFAULT_GROWTH_INTERVAL,
        "bf16_supported": bf16,
    }
    evidence.update(_fp16_evidence(merged))
    rate = THRESHOLDS.target_skip_rate
    if steps and steady / steps > rate:
        evidence["growth_interval"] = math.ceil(1 / rate)
        evidence["steady_skip_rate"] = round(steady / steps, 4)
        evidence["implied_growth_interval"] = max(1, round(steps / steady) - 1)
    elif under is not None and not conflict:
        evidence["growth_interval"] = int(THRESHOLDS.growth_interval_underflow)
    if startup:
        evidence["startup_skips"] = startup
    if conflict:
        evidence["range_conflict"] = True
    dev = device.device_type(session.environment)
    conflict_note = (
        "\n# The scale that avoids underflow overflows other gradients: FP16's range is too narrow"
        "\n# for this model. Keep the overflowing modules in FP32 (torch.autocast(..., enabled="
        "False)\n# around them) or train in BF16 on a device that supports it."
        if conflict
        else ""
    )
    unknown_note = (
        "\n# If this GPU supports BF16 (compute capability >= 8.0), prefer BF16 autocast and drop"
        "\n# the scaler."
        if bf16 is None
        else ""
    )
    return Finding(
        id="tune-grad-scaler",
        severity=worst_severity(merged),  # type: ignore[arg-type]
        title=(
            f"{_capital(consequence(session, merged))}: use a GradScaler with init_scale="
            f"{init_scale:.0f} and growth_interval={evidence['growth_interval']}, computed from "
            "the measured FP16 gradient range."
        ),
        evidence=evidence,
        fix=terms.with_setting(
            session,
            terms.scaler_setting(session, init_scale, int(evidence["growth_interval"])),
            terms.training_step(
                "fp16",
                dev,
                init_scale=init_scale,
                growth_interval=int(evidence["growth_interval"]),
                unscale=True,
            ),
        )
        + conflict_note
        + unknown_note,
        section="gradscaler",
        impact=min(1.0, 0.5 + 0.1 * len(merged)),
    )


@advisor("use-grad-accumulation")
def memory_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """Memory near capacity with activations >= 50% of the peak: accumulate gradients.

    With a rule's own use-grad-accumulation finding present, memory-near-capacity is merged into
    it. Otherwise, from memory-near-capacity's ``peak_bytes``, ``capacity_bytes`` and
    ``activation_bytes`` (activations scale with the micro-batch, the rest does not): the target
    peak is (1 - 0.15) x capacity; accumulation_steps = ceil(activation_bytes / (target - (peak
    - activation_bytes))); micro_batch = floor(batch / steps) where the batch size is known.
    Nothing is advised when the non-activation memory alone exceeds the target, nor to a run
    whose accumulation is broken (grad-accumulation-broken: more micro-batches would be lost).
    """
    if accumulation_broken(session) or find(findings, "grad-accumulation-broken"):
        return
    near = find(findings, "memory-near-capacity")
    existing = find(findings, "use-grad-accumulation")
    if existing:
        yield Advice(existing[0], near)
        return
    if not near:
        return
    mnc = near[0]
    ev = mnc.evidence
    peak, cap = number(ev, "peak_bytes"), number(ev, "capacity_bytes")
    act = number(ev, "activation_bytes")
    if not (peak and cap and act) or act / peak < THRESHOLDS.activation_share_min:
        return
    target = cap * (1 - THRESHOLDS.memory_headroom)
    fixed = peak - act
    budget = target - fixed
    if budget <= 0 or peak <= target:
        return
    steps = max(2, math.ceil(act / budget))
    batch = batch_size(session, mnc)
    micro: int | None = None
    if batch is not None:
        if batch < 2:
            return
        micro = max(1, batch // steps)
        steps = math.ceil(batch / micro)
    fraction = (micro / batch) if (micro and batch) else 1 / steps
    evidence: dict[str, Any] = {
        "micro_batch": micro,
        "accumulation_steps": steps,
        "batch_size": batch,
        "activation_share": round(act / peak, 4),
        "peak_bytes": int(peak),
        "capacity_bytes": int(cap),
        "expected_peak_bytes": int(fixed + act * fraction),
        "target_peak_bytes": int(target),
    }
    rec = Finding(
        id="use-grad-accumulation",
        severity=mnc.severity,
        title=(
            f"Accumulate gradients over {steps} micro-batches"
            + (f" of {micro}" if micro else "")
            + f": activations are {act / peak:.0%} of the peak, which would fall to about "
            f"{(fixed + act * fraction) / cap:.0%} of capacity."
        ),
        evidence=evidence,
        fix=accumulation_fix(session, steps, micro),
        section="memory",
        impact=act / peak,
    )
    yield Advice(rec, [mnc])


@advisor("tune-input-pipeline", "increase-batch-size")
def throughput_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """The device waits: feed it faster (data loading) or give it more work per launch.

    tune-input-pipeline: dataloader-bound present (data_share >= 10%, its rule's threshold);
    gpu-idle is merged into it. num_workers = ceil(data_ms / compute_ms) + 1 in [2, 16] (W
    workers deliver a batch every data_ms / W), pin_memory on CUDA.

    increase-batch-size: gpu-idle (idle_share above 10%) with no data wait and no
    memory-near-capacity; launch-bound merged. With a fixed per-step host overhead, a batch k
    times larger gives idle share s / (s + (1 - s) k); k = ceil(s (1 - t) / (t (1 - s))) reaches
    t = 10%, capped at 8.
    """
    dl = _actionable(findings, "dataloader-bound")  # an uncertain (info) one advises nothing
    idle = find(findings, "gpu-idle")
    dev = device.device_type(session.environment)
    if dl:
        yield _input_pipeline(dl[0], idle, dev)
        return
    if not idle or find(findings, "memory-near-capacity"):
        return
    gi = idle[0]
    s = number(gi.evidence, "idle_share")
    t = THRESHOLDS.target_idle_share
    if s is None or s <= t or s >= 1:
        return
    k = min(int(THRESHOLDS.batch_multiplier_max), math.ceil(s * (1 - t) / (t * (1 - s))))
    if k < 2:
        return
    batch = batch_size(session, gi)
    explained = [gi, *find(findings, "launch-bound")]
    expected_idle = s / (s + (1 - s) * k)
    rec = Finding(
        id="increase-batch-size",
        severity=worst_severity(explained),  # type: ignore[arg-type]
        title=(
            f"The GPU is idle {s:.0%} of the time: a {k}x larger batch"
            + (f" ({batch} -> {batch * k})" if batch else "")
            + f" would bring idle to about {expected_idle:.0%}."
        ),
        evidence={
            "idle_share": s,
            "batch_multiplier": k,
            "batch_size": batch,
            "suggested_batch_size": batch * k if batch else None,
            "expected_idle_share": round(expected_idle, 4),
        },
        fix=(
            f"loader = DataLoader(dataset, batch_size={batch * k if batch else f'{k} * batch'}, "
            "...)\n"
            f"# scale the learning rate with the batch (e.g. lr *= {k} for SGD, sqrt({k}) for "
            "Adam),\n# or cut the per-step launch overhead instead:\n"
            'model = torch.compile(model, mode="reduce-overhead")   # CUDA graphs'
        ),
        section="time",
        impact=s,
    )
    yield Advice(rec, explained)


def _input_pipeline(dl: Finding, idle: list[Finding], dev: str) -> Advice:
    ev = dl.evidence
    share = number(ev, "data_share") or 0.0
    data_ms = number(ev, "data_ms_per_step")
    step_ms = number(ev, "step_ms")
    if data_ms is not None and step_ms is not None and step_ms > data_ms:
        ratio = data_ms / (step_ms - data_ms)
    else:
        ratio = share / max(1e-9, 1 - share)
    lo, hi = int(THRESHOLDS.num_workers_min), int(THRESHOLDS.num_workers_max)
    workers = max(lo, min(hi, math.ceil(ratio) + 1))
    pin = dev == "cuda"
    evidence: dict[str, Any] = {
        "data_share": share,
        "data_ms_per_step": data_ms,
        "step_ms": step_ms,
        "num_workers": workers,
        "pin_memory": pin,
    }
    if step_ms is not None and data_ms is not None:
        evidence["expected_step_ms"] = round(max(step_ms - data_ms, data_ms / workers), 3)
    rec = Finding(
        id="tune-input-pipeline",
        severity=worst_severity([dl, *idle]),  # type: ignore[arg-type]
        title=(
            f"Data loading takes {share:.0%} of each step: load in {workers} worker processes"
            + (" with pinned memory" if pin else "")
            + " so batches are ready when the model asks."
        ),
        evidence=evidence,
        fix=(
            f"loader = DataLoader(dataset, batch_size=..., num_workers={workers}, "
            f"pin_memory={pin},\n"
            "                    persistent_workers=True, prefetch_factor=2)"
            + ("\nx = x.to('cuda', non_blocking=True)   # overlaps the copy" if pin else "")
        ),
        section="time",
        impact=share,
    )
    return Advice(rec, [dl, *idle])
