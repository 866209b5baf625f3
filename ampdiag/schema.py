"""The shape of a session.json: one TypedDict per section, and a checker for loaded documents.

Collectors return these types from ``section()``, analysis rules and renderers read them through
`Session.section`, so ``mypy --strict`` catches a key one side writes and the other reads under
another name. The top-level keys of each section are typed; values below them stay loose where
their shape is a collector's own business (rows of a table, histograms).

Every section is ``total=False``: a reader must cope with a key missing (an older session, a
collector that failed half-way), and `check` only rejects a present key of the wrong type.
Torch-free: the report of a saved session imports this module.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Required, TypedDict, Union

#: Version of the session document. Bump it when a key changes meaning or type; readers
#: accept every version up to this one.
SCHEMA_VERSION = 1

# JSON cannot hold NaN or inf: `ampdiag.session.dumps` writes them as these strings, so a float
# read back from disk may be one of them.
NONFINITE_TEXT = frozenset({"nan", "inf", "-inf"})


class Environment(TypedDict, total=False):
    """Where the run happened (``environment``); a trace source fills only part of it."""

    source: str
    torch_version: str
    python_version: str
    platform: str
    cpu: str
    cpu_flags: list[str]
    cuda_available: bool
    rank: int
    world_size: int
    ranks_in_trace: int
    ranks_merged: list[int]
    device_type: str
    device_name: str
    device_memory_bytes: int
    device_capability: str
    bf16_native: bool
    bf16_supported: bool
    autocast: str | None
    autocast_seen: dict[str, int]
    framework_precision: dict[str, str]  # what a framework asked for, e.g. {"accelerate": "fp16"}
    framework: dict[str, Any]  # the framework the run came through: name, precision, flags
    profiled_steps: dict[str, Any]  # a trace's ProfilerSteps: count, median/min/max_us
    kernel_precisions: dict[str, float]  # a trace's computation-kernel time share by precision


class ErrorInfo(TypedDict, total=False):
    """The user's exception that ended the block (``error``, status "error"/"interrupted")."""

    type: str
    message: str
    traceback: str


class FindingDoc(TypedDict, total=False):
    """One finding (``findings[i]``), see `ampdiag.session.Finding` (rebuilt from this)."""

    id: Required[str]
    severity: Required[Literal["high", "medium", "low", "info"]]
    title: Required[str]
    evidence: dict[str, Any]
    fix: str
    section: str
    impact: float


class Origin(TypedDict, total=False):
    """The first non-finite value of a phase (``sentinel.forward_origin``/``backward_origin``).

    ``phase``: forward, loss or backward. ``module`` is the deepest module whose input was
    finite and whose output is not (forward; ``kind`` "output", or "input" for a model input
    already non-finite), whose output gradient was finite and input gradient is not (backward;
    "input gradient"), ``"(loss)"`` (the loss, or the gradient from it), or the module of the
    first non-finite parameter gradient ("parameter gradient"). ``parent_code`` True (``kind``
    "own code"): the value was made in that module's own code, not in a child: ``between`` is
    ``[child before, child after]`` (module names, None at either end) -- forward, the last
    child that returned finite values and the first that received a non-finite input;
    backward, the child whose output gradient was the first non-finite one (the code lies
    after it in the forward) and the child whose backward ran just before (after the code), or
    ``[None, child]`` when the module's input gradient is the first non-finite one though its
    children's came back finite. ``between`` is present only when ``parent_code`` is True.
    """

    step: Required[int]
    phase: str
    module: Required[str]
    kind: str
    parent_code: bool
    between: list[str | None]
    reproduced: bool  # False: localized by a replay of the step that stayed finite


class Step(TypedDict, total=False):
    """One training step (``steps[i]``).

    Attributes:
        index: Step number, from 0, counted from the start of the diagnosed block.
        wall_s: Wall-clock time from the previous step boundary to this one.
        loss: The step's loss where one was seen: the sum of the losses given to the scaler
            (else passed to backward) over the step's micro-batches.
        profiled: Whether the profiler was recording this step.
        sampled: Whether the sampled (more expensive) collectors ran on this step.
        micro_batches: Backward passes in this step that reached the model's first trainable
            parameter (gradient accumulation: more than 1); None when no model was known.
    """

    index: int
    wall_s: float
    loss: float | None  # NaN and inf too (session.json holds them as "nan", "inf", "-inf")
    profiled: bool
    sampled: bool
    micro_batches: int | None


class RunSection(TypedDict, total=False):
    """What diagnose() found (``run``): models, optimizers, scaler, autocast, warnings."""

    models: list[dict[str, Any]]
    optimizers: list[str]
    scaler: dict[str, Any] | None
    autocast_seen: dict[str, int]
    duration_s: float
    warnings: list[str]
    backward_calls: int
    optimizer_steps: int
    step_boundaries: int
    window: dict[str, Any]  # a window of steps: planned, opened/closed, the trigger's spike


class ProfilerSection(TypedDict, total=False):
    """The torch.profiler collector (``profiler``): trace files, schedule, step breakdown."""

    trace_files: list[str]
    schedule: dict[str, int]
    steps_seen: int
    recorded_steps: list[int]
    top_ops: list[dict[str, Any]]
    error: str | None
    skipped: str | None
    breakdown: dict[str, Any]
    native_log: list[str]


class SpeedProbeSection(TypedDict, total=False):
    """The speed probe (``speed_probe``): FP32 against autocast timings, or why none."""

    batch_size: int | None
    skipped: str | None
    error: str
    measured: str
    repeats: int
    fp32_ms: float
    fp32_ms_spread: float
    autocast_ms: float
    autocast_ms_spread: float
    fp32_ms_all: list[float]
    autocast_ms_all: list[float]
    ratio: float
    ratio_low: float
    ratio_high: float
    tight: bool
    tolerance: float
    budget_s: float
    # older sessions: the headline times were the best samples, the medians beside them
    fp32_ms_median: float
    autocast_ms_median: float
    modules: list[dict[str, Any]]
    autocast: str
    precisions: dict[str, Any]


class MemorySection(TypedDict, total=False):
    """The memory collector (``memory``): model state, timeline, peak, batches, budget."""

    device: str
    model_state: dict[str, Any]
    batches: dict[str, int]
    observed_batch: int
    probes: list[dict[str, Any]]
    target_batch: int | None
    limit_bytes: int | None
    errors: list[str]
    peak: dict[str, Any]
    step_activation_peaks: dict[str, int]
    live_activation_points: list[list[int]]
    saved_activations: dict[str, dict[str, Any]]
    activation_peak: dict[str, Any]
    micro_batches_max: int
    timeline: dict[str, Any]
    cuda: dict[str, Any]
    capacity_bytes: int | None
    capacity_source: str
    snapshot_file: str  # the CUDA snapshot a snapshot session was read from


class AccumulationSection(TypedDict, total=False):
    """Gradient accumulation (``accumulation``), per sampled step with several backward passes.

    Each step: resets between its backward passes, the micro-batches' loss weights, the
    gradient norm ratio (see `ampdiag.sources.live.collectors.accumulation`).
    """

    steps: list[dict[str, Any]]
    errors: list[str]


class WeightUpdatesSection(TypedDict, total=False):
    """Low-precision weights (``weight_updates``): BF16/FP16 parameters an optimizer updates.

    ``optimizers``: per optimizer, its class, parameter count, the BF16/FP16 ones (count,
    elements, ``dtypes``, ``examples``), its learning rates and ``master_params`` (those whose
    state holds an FP32 master copy: not measured). On sampled steps, of the sampled values
    whose gradient was nonzero (``elements``), those the step left bit-for-bit unchanged
    (``unchanged``: the update rounded away), per step (``steps``), in total and for the
    parameters losing the largest share (``params``); see
    `ampdiag.sources.live.collectors.weight_updates`. ``grads_not_cleared``: of the backwards
    that began after an optimizer step (``checked``), those that began with that step's
    gradients never cleared (``not_cleared``, their ``steps``).
    """

    optimizers: list[dict[str, Any]]
    grads_not_cleared: dict[str, Any]
    steps: list[dict[str, Any]]
    steps_measured: int
    elements: int
    unchanged: int
    unchanged_share: float | None
    params: list[dict[str, Any]]
    max_elements_per_param: int


class PrecisionSection(TypedDict, total=False):
    """The dtype audit (``precision``): the dtype every op of one step ran in."""

    audited: bool
    step: int | None
    device_type: str
    entry_state: str
    cuda_policy_source: str
    cuda_policy_ops: int
    audit_wall_s: float
    not_audited_reason: str
    ops: list[dict[str, Any]]
    autocast_dtypes: dict[str, str]
    after_backward_ops: dict[str, Any]
    reenabled_autocast_ops: list[str]  # op names (sorted), as the precision collector writes them
    sdpa: list[dict[str, Any]]  # F.scaled_dot_product_attention calls: settings, fused or math
    errors: list[str]


class ScalerSection(TypedDict, total=False):
    """The GradScaler collector (``scaler``): scale history, skips, misuse."""

    present: bool
    scaler: dict[str, Any] | None
    history: list[dict[str, Any]]
    history_stride: int
    steps_total: int
    skipped_total: int
    growth_total: int
    backoff_total: int
    scale_min: float | None
    skipped_steps: list[int]
    growth_steps: list[int]
    backoff_steps: list[int]
    unscale_calls: int
    clip_events: list[dict[str, Any]]
    bypassed_steps: list[int]
    fp16_params: list[dict[str, Any]]
    errors: list[str]


class GradientsSection(TypedDict, total=False):
    """Gradient statistics (``gradients``): per step, per parameter, exponent histograms."""

    sample_elements: int
    steps: list[dict[str, Any]]
    params: list[dict[str, Any]]
    totals: dict[str, Any]
    hist_held: dict[str, int]
    hist_true: dict[str, int]
    last_hist: dict[str, Any]


class ActivationsSection(TypedDict, total=False):
    """Activation range and underflow (``activations``), predictions per scale, NaN origin."""

    sample_elements: int
    sampled_steps: int
    scales_seen: list[float]
    modules: list[dict[str, Any]]
    exponents: dict[str, int]
    predictions: list[dict[str, Any]]
    recommended_scale_log2: int | None
    recommended_init_scale: float | None
    scale_reaches_target: bool
    boundary: dict[str, Any] | None
    scale_from_fp32_replay: bool
    recommended_at_step: int | None
    replay: dict[str, Any] | None  # the FP32 replays (collectors.activations._replay_section)
    # replays that gave no FP32 truth: {steps, first_step, reason}; None: none failed
    replay_failed: dict[str, Any] | None
    nonfinite_origin: dict[str, Any] | None
    nonfinite_steps: list[Any]


class Fp8AmaxSection(TypedDict, total=False):
    """Per Linear, its FP8 operands' amax on each sampled step (``fp8_amax``).

    ``steps``: the sampled steps; ``layers``: name -> ``{input, weight, grad_output}``, one
    amax per step (None where the operand was not seen that step).
    """

    steps: list[int]
    layers: dict[str, dict[str, list[float | None]]]
    errors: list[str]


class SentinelSection(TypedDict, total=False):
    """The divergence sentinel (``sentinel``): the first inf/NaN by phase, on every step."""

    steps_watched: int
    forward_origin: Origin | None
    backward_origin: Origin | None
    nonfinite_steps: list[int]
    nonfinite_step_count: int
    backward_only_steps: list[int]
    loss_nonfinite_steps: list[int]
    zero_grad_steps: list[int]
    # the last step checked (None: none had a value to check) and whether its loss was
    # inf/NaN: whether the run ended diverged, past the listed steps or after a window
    last_step: int | None
    last_loss_nonfinite: bool
    # [step, loss] of the finite step losses up to the first non-finite forward or loss:
    # the first 8 and the last 56 (a window's session: the trend into it)
    loss_history: list[list[float]]
    errors: list[str]
    # the first non-finite step replayed (`divergence_replay`): step, when, run_precision,
    # micro_batch, loss_scale, backward_not_replayed, weights ({max_abs, norm} of the step's
    # weights before its update, start: the same at the first step checked),
    # parameters_finite_after (the weights
    # after that step's update), results {fp32, bf16: {finite, origin,
    # forward_finite, backward_replayed, max_abs, max_abs_module, grad_max_abs, ...} or
    # {error}}, error (why not replayed); None: no step was non-finite
    replay: dict[str, Any] | None


class TimelineSection(TypedDict, total=False):
    """GPU timeline figures per rank (``timeline``), in HTA's definitions."""

    source: str
    trace_files: list[str]
    ranks: list[dict[str, Any]]
    summary: dict[str, Any]
    communication: dict[str, Any]  # ampdiag.analysis.communication.across_ranks
    warnings: list[str]
    hta: dict[str, Any]


class RanksSection(TypedDict, total=False):
    """The ranks of a merged distributed run (``ranks``), see `ampdiag.sources.ranks`."""

    world_size: int
    rows: list[dict[str, Any]]  # ampdiag.analysis.ranks.rank_row, one per rank
    summaries: list[dict[str, Any]]  # {"rank", "folder", "findings": that rank's own}
    members: list[dict[str, Any]]  # older merges: {"rank", "folder", "session": its document}
    warnings: list[str]


class PrecisionSummary(TypedDict, total=False):
    """``derived.precision``: the audited step by precision (`analysis.precision.summarize`).

    ``flops``/``time_us``: ``{low, fp32, cast}``; ``matmul``: ``{low_flops, fp32_flops,
    fp32_share, autocast_share}``; ``casts``: cast kind -> ``{count, bytes, time_us}`` with a
    ``total``; ``reason_fixes``: each FP32 reason seen -> its fix.
    """

    flops: dict[str, int]
    time_us: dict[str, float]
    fp32_flops_share: float
    fp32_time_share: float
    cast_time_share: float
    matmul: dict[str, float]
    top_fp32_by_flops: list[dict[str, Any]]
    top_fp32_by_time: list[dict[str, Any]]
    top_fp32: list[dict[str, Any]]  # one row per (op, module, reason, phase)
    reasons: dict[str, Any]
    casts: dict[str, dict[str, float]]
    modules: dict[str, Any]
    device_differences: list[dict[str, Any]]
    reason_fixes: dict[str, str]


class WhatIfRow(TypedDict):
    """One row of the memory what-if table: what, its bytes, and what it rests on."""

    scenario: str
    bytes: int | None
    basis: str


class MemoryWhatIf(TypedDict, total=False):
    """``derived.memory``: the what-if estimates (`analysis.memory_estimates.whatif`)."""

    model_state_bytes: int | None
    activation_bytes_at_peak: int
    capacity_bytes: int | None
    capacity_source: str | None
    activation_fit: dict[str, Any]  # bytes = fixed + per_sample * batch, fitted to the probes
    amp: dict[str, Any]  # activations in FP32 against low precision at one batch
    plan: dict[str, Any] | None  # the micro-batch x accumulation steps for the target batch
    rows: list[WhatIfRow]


class UnderflowSummary(TypedDict, total=False):
    """``derived.numerics.underflow``: what FP16 loses (`analysis.numerics.underflow_summary`)."""

    underflow_fraction: float
    boundary_lost_fraction: float
    activation_grad_subnormal_fraction: float | None
    activation_grad_flush_fraction: float | None
    param_grad_subnormal_fraction: float
    param_grad_flush_fraction: float
    param_grad_zero_fraction: float
    worst_module: str | None
    worst_module_fraction: float | None
    module_lost_fraction: dict[str, float]  # the modules that lose the largest shares
    recommended_init_scale: float | None
    recommended_at_step: int | None
    scale_reaches_target: bool | None
    measured: bool
    unmeasured: dict[str, str]  # figure -> why it was not measured


class NumericsDerived(TypedDict, total=False):
    """``derived.numerics``: FP16's underflow, and FP16's limits (log2)."""

    underflow: UnderflowSummary
    fp16_limits_log2: dict[str, float]  # flush, subnormal, overflow


class FirstNonfinite(TypedDict, total=False):
    """``derived.divergence.first``: the first non-finite step that matters, what held it."""

    step: Required[int]
    held: Required[list[str]]  # loss, activation, gradient, parameter
    module: Required[str | None]
    weights_nonfinite_before: bool  # an earlier update made the step's weights non-finite


class LossTrend(TypedDict, total=False):
    """``derived.divergence.trend``: the finite loss before the first non-finite step."""

    steps: Required[int]
    first_loss: float
    last_finite_loss: float
    last_finite_step: int
    start_median_abs: float
    growth: float  # the last losses over the start's median
    exploding: bool
    weights_growth: float  # the replayed step's weights over the first step's
    weights_held: bool  # the loss grew but the weights did not: not exploding


class DivergenceCause(TypedDict, total=False):
    """``derived.divergence.cause``: whether precision made the first non-finite step.

    ``cause``: precision, not-precision or unknown, with ``why``; ``kind``/``text``: which
    range the precision left (forward-overflow, gradient-overflow, fp16-range, rounding,
    low-precision-update, update, mask-constant, custom-function); ``op``: the op the replay in
    the run's precision saw make it; ``state_restored``: the recurrent state put back for the
    replay; ``replay``: each replayed precision's figures.
    """

    run_precision: str
    replay_step: int | None
    micro_batch: int | None
    replay: dict[str, dict[str, Any]]
    backward_not_replayed: Any
    loss_scale: float
    upcast: str
    cause: str
    why: str
    module: str | None
    kind: str
    text: str
    max_abs: float
    grad_max_abs: float
    bf16_finite: bool | None
    eps_below_fp16: float | None
    op: dict[str, Any]
    state_restored: list[str]


class DivergenceResult(TypedDict, total=False):
    """``derived.divergence`` (`analysis.divergence.assess`): diverged, stalled or healthy."""

    steps: Required[int]
    verdict: str  # diverged, stalled, healthy
    first: FirstNonfinite
    loss_nonfinite_steps: int
    skipped_steps: int
    scale_min: float
    scale_collapsed: bool
    skipped_to_end_from: int | None
    recovered_steps: list[int]  # non-finite steps the run recovered from (at most 20)
    trend: LossTrend
    cause: DivergenceCause


class ChoiceDoc(TypedDict):
    """The precision the A/B recommends (`precision_choice.Choice`, its fields)."""

    precision: str
    tied: list[str]
    unsafe: dict[str, list[str]]
    timed: bool
    saved_bytes: dict[str, float]
    emulated: list[str]


class PrecisionChoice(TypedDict):
    """What the A/B says for the advice (`precision_choice.measured`, computed once).

    ``run``: the run's own precision; ``choice``: None when the advice cannot rest on the A/B,
    ``why_not`` saying why.
    """

    run: str | None
    choice: ChoiceDoc | None
    why_not: str | None


class Fp8Readiness(TypedDict, total=False):
    """``derived.fp8``: the A/B's FP8 row with each layer's amax movement (`analysis.fp8`).

    The A/B row's own keys (recipe, time and loss figures, ``layers``) and the verdicts:
    ``convert``/``keep`` (layer names), ``filter`` (the module filter in the recipe's terms).
    """

    recipe: str
    recipes: list[str]
    layers: list[dict[str, Any]]  # each with amax_drift, reasons and verdict
    loss_fp32: float | None
    loss_bf16: float | None
    loss_fp8: float | None
    speedup: float | None
    speed: str  # why the speed was not measured, where it was not
    spent_s: float
    convert: list[str]
    keep: list[str]
    filter: str
    loss_measured_for: list[str]  # the batch's own verdicts, before the drift
    loss_rel_diff_vs_bf16: float | None
    amax_drift: str
    thresholds: dict[str, float]


class StepTime(TypedDict):
    """``derived.figures.step_time``: median wall time of a step, with its spread (MAD)."""

    median_s: float
    spread_s: float | None
    steps: int
    first_left_out: bool


class SpeedVsFp32(TypedDict, total=False):
    """``derived.figures.speed_vs_fp32``: the run's time per step against FP32's."""

    source: str  # precision A/B, speed probe
    precision: str | None
    fp32_ms: float
    run_ms: float
    fp32_spread_ms: float | None
    run_spread_ms: float | None
    time_ratio: float  # the run's over FP32's (below 1: faster), with its interval
    low: float
    high: float
    samples: int
    verdict: str  # faster, slower, tied


class Figures(TypedDict, total=False):
    """``derived.figures``: the headline figures every surface states (`analysis.figures`)."""

    step_time: StepTime | None
    final_loss: float | None
    memory_peak_bytes: float | None
    underflow_fraction: float | None
    skipped_steps: dict[str, int] | None
    loss_scale: dict[str, float] | None
    low_precision_flops_share: float | None
    low_precision_time_share: float | None
    speed_vs_fp32: SpeedVsFp32 | None


class Compute(TypedDict):
    """``derived.compute``: what the run computes in (`ampdiag.analysis.compute`).

    ``precision``: "fp16", "bf16" or "fp32"; ``autocast``: the low-precision autocast it
    entered ("cpu:bfloat16"), and ``autocast_precision`` its name ("bf16"); None for none.
    """

    precision: str
    autocast: str | None
    autocast_precision: str | None


class DerivedSection(TypedDict, total=False):
    """What analysis derives for the reports (``derived``, `ampdiag.analysis.derive`).

    Each part is computed once there and read by rules, advisors and renderers; a part whose
    input is missing is left out. ``verdict``: the run's one-word category (healthy, slow,
    diverged, stalled...); ``errors``: part -> why it could not be derived.
    """

    compute: Compute
    precision: PrecisionSummary
    memory: MemoryWhatIf
    numerics: NumericsDerived
    divergence: DivergenceResult
    fp8: Fp8Readiness
    precision_choice: PrecisionChoice
    figures: Figures
    verdict: str
    errors: dict[str, str]


#: Section name -> its type. A section not named here is kept as it is and not checked. Every
#: registered collector's section is here, with the same type as its ``section()`` returns
#: and `Session.section` gives (tests/test_schema.py).
SECTIONS: dict[str, type] = {
    "run": RunSection,
    "profiler": ProfilerSection,
    "speed_probe": SpeedProbeSection,
    "memory": MemorySection,
    "precision": PrecisionSection,
    "scaler": ScalerSection,
    "gradients": GradientsSection,
    "activations": ActivationsSection,
    "sentinel": SentinelSection,
    "fp8_amax": Fp8AmaxSection,
    "timeline": TimelineSection,
    "ranks": RanksSection,
    "accumulation": AccumulationSection,
    "weight_updates": WeightUpdatesSection,
    "derived": DerivedSection,
}


def check(value: Any, expected: Any, where: str, strict: bool = False) -> list[str]:
    """The places where ``value`` does not have the type ``expected`` (empty when it does).

    Args:
        value: A JSON value (as loaded, or as a collector returned it).
        expected: A type from this module (a TypedDict, ``list[...]``, ``X | None``...).
        where: The path of ``value`` in the document, for the messages.
        strict: Also report keys a TypedDict does not declare (the contract test's mode:
            every key a collector writes is in the schema). Loading is lenient, so a session
            written by a newer ampdiag still loads.

    Returns:
        One message per mismatch, such as ``"memory.observed_batch: expected int, got str"``.
    """
    if not strict and _predicate(expected)(value):
        return []  # the common case, fast: the messages are worked out only for a mismatch
    if expected is Any or expected is object:
        return []
    if _is_typeddict(expected):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        hints = _hints(expected)
        problems = [f"{where}.{k}: missing" for k in _required(expected) if k not in value]
        for key, item in value.items():
            if key in hints:
                problems += check(item, hints[key], f"{where}.{key}", strict)
            elif strict:
                problems.append(f"{where}.{key}: not in the schema")
        return problems
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin in (Union, types.UnionType):
        options = [check(value, a, where, strict) for a in args]
        if any(not o for o in options):
            return []
        # an object or list where one option is a container of that kind: what is wrong inside
        inner = [o for a, o in zip(args, options, strict=True) if _container(a) is type(value)]
        if len(inner) == 1:
            return inner[0]
        return [f"{where}: expected {_name(expected)}, got {type(value).__name__}"]
    if origin is Literal:
        return [] if value in args else [f"{where}: expected one of {args}, got {value!r}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in check(v, args[0], f"{where}[{i}]", strict)]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        return [p for k, v in value.items() for p in check(v, args[1], f"{where}.{k}", strict)]
    if _scalar_ok(value, expected):
        return []
    return [f"{where}: expected {_name(expected)}, got {type(value).__name__}"]


def check_document(doc: dict[str, Any], strict: bool = False) -> list[str]:
    """The mismatches of a whole session document (environment, steps, known sections)."""
    problems = check(doc.get("environment", {}), Environment, "environment", strict)
    problems += check(doc.get("config", {}), dict[str, Any], "config", strict)
    problems += check(doc.get("steps", []), list[Step], "steps", strict)
    problems += check(doc.get("error"), ErrorInfo | None, "error", strict)
    problems += check(doc.get("findings", []), list[FindingDoc], "findings", strict)
    for key in ("created", "ampdiag_version"):
        problems += check(doc.get(key, ""), str, key, strict)
    for name, kind in SECTIONS.items():
        if name in doc:
            problems += check(doc[name], kind, name, strict)
    return problems


#: The JSON values each scalar schema type accepts (a bool is no int or float here).
_SCALARS: dict[type, type | tuple[type, ...]] = {
    type(None): type(None), bool: bool, int: int, float: (int, float), str: str, dict: dict,
    list: list,
}  # fmt: skip


def _scalar_ok(value: Any, expected: Any) -> bool:
    if expected is float and isinstance(value, str):
        return value in NONFINITE_TEXT
    kind = _SCALARS.get(expected) if isinstance(expected, type) else None
    if kind is None or (isinstance(value, bool) and expected is not bool):
        return False
    return isinstance(value, kind)


@functools.cache
def _predicate(expected: Any) -> Callable[[Any], bool]:
    """Whether a value has the type ``expected`` (lenient: unknown keys allowed), compiled once."""
    if expected is Any or expected is object:
        return lambda v: True
    if _is_typeddict(expected):
        fields = {k: _predicate(t) for k, t in _hints(expected).items()}
        required = _required(expected)
        return lambda v: (
            isinstance(v, dict)
            and all(k in v for k in required)
            and all(fields[k](x) for k, x in v.items() if k in fields)
        )
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (Union, types.UnionType):
        options = [_predicate(a) for a in args]
        return lambda v: any(ok(v) for ok in options)
    if origin is Literal:
        return lambda v: v in args
    if origin is list:
        item = _predicate(args[0])
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin is dict:
        value = _predicate(args[1])
        return lambda v: isinstance(v, dict) and all(value(x) for x in v.values())
    return lambda v: _scalar_ok(v, expected)


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    # cached: a session's steps are checked one TypedDict at a time, thousands of them
    return typing.get_type_hints(kind)


@functools.cache
def _required(kind: type) -> tuple[str, ...]:
    """The keys a TypedDict marks ``Required`` (a section's are all optional: total=False).

    Read from the resolved annotations: with ``from __future__ import annotations`` Python
    3.11's ``__required_keys__`` cannot see ``Required`` inside a string annotation.
    """
    hints = typing.get_type_hints(kind, include_extras=True)
    return tuple(k for k, t in hints.items() if typing.get_origin(t) is Required)


def _container(kind: Any) -> type | None:
    """The JSON container type a schema type stands for (dict, list), None for a scalar."""
    if _is_typeddict(kind) or typing.get_origin(kind) is dict or kind is dict:
        return dict
    if typing.get_origin(kind) is list or kind is list:
        return list
    return None


def _is_typeddict(kind: Any) -> bool:
    return isinstance(kind, type) and typing.is_typeddict(kind)


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
