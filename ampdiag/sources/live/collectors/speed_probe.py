"""Is mixed precision faster here? The model's step timed in FP32 and under the run's autocast.

Autocast is not always a speed-up: a CPU without native BF16 (no AVX512_BF16/AMX) emulates it,
and small GPU matmuls can lose more to casts than they gain. The probe measures it, on the
user's own model and batch, instead of assuming it.

How it measures, observing and never changing:

- During the run a forward pre-hook on the root model keeps a reference to the inputs of the
  last forward of a sampled step (no copy, no compute), and the batch size (the leading
  dimension of the first tensor input). The autocast it compares with is the run's
  (`discovery.dominant_autocast` of ``autocast_seen``: the state the model's ops ran in,
  wherever autocast was entered). A forward wrapped in autocast by a framework
  (``model.forward = autocast(...)(model.forward)``, as Accelerate does) is timed through the
  class's own forward, so that the FP32 pass really runs in FP32.
- At ``after_stop()``, once the block has ended without an error and every collector has
  removed its hooks, it deep-copies the model and runs the precision A/B on the copy
  (`ampdiag.compare`): FP32, the run's precision and every other the device runs, in
  interleaved rounds, forward and a backward of a surrogate loss (the sum of the floating
  outputs) with ``torch.autograd.grad``, which touches no ``.grad``. FP32, the run's own
  precision and every precision the device runs natively are timed three times at least
  whatever the budget (while still racing), so that every figure has a spread, and up to six
  while a speed claim between two of them rests on the 1.10x bar (`compare.NEAR_BAR`);
  ``speed_probe_repeats`` rounds at least and more until each median is known to within 5%,
  as long as the A/B's budget allows (``precision_ab_budget_s``, at most 5% of the block's
  wall time). The probe's figures are the A/B's two rows: one timing of each precision, stated
  once. Every figure is a median with its spread, and the ratio's interval is what the two
  medians' intervals allow: a run on a loaded machine that cannot tell the two apart says so
  (``ratio_low`` / ``ratio_high`` straddle the threshold, and ``autocast-slower`` is reported
  as uncertain) instead of flipping from run to run. With ``precision_ab_budget_s=0`` only
  FP32 and the run's precision are measured, and the section says the A/B was off.
- The extra forwards run on the copy, never on the user's objects: the user's parameters,
  buffers, ``.grad`` and the Python state a ``forward`` may keep (a step counter, a cache) are
  untouched. The copy is skipped, with the reason, when it is impossible or would take more
  than a quarter of the device's free memory. The random number generators are forked, so
  dropout draws nothing the training would see. Training after the block is bit-identical to
  training without it.

It does not run under torch.distributed with several ranks (extra forwards on one rank would
desynchronise DDP/FSDP collectives), when the block raised, or with ``speed_probe=False``.
Forward hooks the user registered as plain functions on the model are copied by reference, so
they do see the probe's extra forwards (on the copy).
"""

from __future__ import annotations

import copy
import sys
import time
from typing import Any, cast

import torch

from ampdiag import timing
from ampdiag.analysis import precision_choice as pc
from ampdiag.analysis.compute import autocast_precision
from ampdiag.compat.fp8 import device_has_fp8
from ampdiag.compat.modules import eager_copy_fix, uncompiled
from ampdiag.config import DiagnoseConfig
from ampdiag.schema import SpeedProbeSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors.base import (
    Collector,
    RunContext,
    internal_work,
    tensors_in,
)
from ampdiag.sources.live.compare import compare, model_device, supported_precisions
from ampdiag.sources.live.discovery import dominant_autocast

#: Share of the block's wall time the A/B may spend at most (its least version apart): half of
#: what the whole exit may take (10%), the other half left to the trace, analysis and reports.
BLOCK_SHARE = 0.05
#: Timing stops once every median's spread (MAD) is at most this share of it.
TOLERANCE = 0.05


def _is_distributed(model: torch.nn.Module) -> bool:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return True
    return "DistributedDataParallel" in type(model).__name__ or "FullyShard" in str(type(model))


COMPILED = (
    "the speed probe and the precision A/B timed the torch.compile'd model's original module, "
    "run eagerly (a compiled copy would compile again): the figures compare precisions, "
    "without torch.compile's own speed-up"
)


@COLLECTORS.register
class SpeedProbe(Collector):
    """Times the model's forward + backward in FP32 and under the run's autocast, once."""

    name = "speed_probe"

    @classmethod
    def from_config(cls, config: DiagnoseConfig) -> SpeedProbe:
        """Always attached: with ``speed_probe=False`` its section says it was disabled."""
        return cls()

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._model: torch.nn.Module | None = None
        self._handle: Any = None
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._autocast: str | None = None
        self._batch: int | None = None
        self._probing = False
        self._result: dict[str, Any] = {}
        self._skipped: str | None = None
        self._began = time.perf_counter()

    def start(self, run: RunContext) -> None:
        """Remembers the run (for the sampling schedule) and when the block began."""
        self._run = run
        self._began = time.perf_counter()

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Watches the first (root) model's forward inputs."""
        if self._handle is not None:
            return
        self._model = model
        self._handle = global_hooks.on_module(model, global_hooks.MODULE_INPUTS, self._pre)

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._probing or (self._run is not None and not self._run.on_block_thread()):
            return
        if self._batch is None:
            first = next(tensors_in((args, kwargs), max_depth=2), None)
            if first is not None and first.dim() > 0:
                self._batch = int(first.shape[0])
        if self._run is None or self._run.is_sampled():
            self._inputs = (args, kwargs)

    def stop(self, run: RunContext) -> None:
        """Removes the hook (the probe runs in `after_stop`, once every hook is gone)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def after_stop(self, run: RunContext) -> None:
        """Runs the A/B on a copy of the model, unless the block failed or it cannot."""
        inputs, self._inputs = self._inputs, None
        raised = run.block_raised
        if raised is None:
            raised = sys.exc_info()[1] is not None
        model = self._model
        self._autocast = dominant_autocast(run.autocast)
        own = autocast_precision(self._autocast)
        if not run.config.speed_probe:
            self._skipped = "disabled (speed_probe=False)"
        elif raised:
            self._skipped = "the block raised: no extra work after an error"
        elif model is None:
            self._skipped = "no model was found"
        elif self._autocast is None:
            self._skipped = "no forward ran under autocast"
        elif own is None:
            self._skipped = f"the run's autocast ({self._autocast}) is no precision it measures"
        elif inputs is None:
            self._skipped = "no forward ran on a sampled step"
        elif _is_distributed(model):
            self._skipped = "distributed run: extra forwards would desynchronise the ranks"
        if self._skipped is not None or model is None or inputs is None or own is None:
            return
        model, compiled = uncompiled(model)
        inputs = (widened(inputs[0]), widened(inputs[1]))
        copy, why = copy_of(model)
        if copy is None:
            self._skipped = why
            return
        eager_copy_fix(copy)
        if compiled:
            run.warn(COMPILED)
        self._probing = True
        try:
            self._result = self._measure(run, copy, inputs, own)
        except Exception as exc:  # the probe must never cost the user the report
            self._result = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self._probing = False
            del copy

    def _measure(
        self,
        run: RunContext,
        copy: torch.nn.Module,
        inputs: tuple[tuple[Any, ...], dict[str, Any]],
        own: str,
    ) -> dict[str, Any]:
        """The A/B on the copy (`ampdiag.compare`), and the probe's figures from its two rows.

        Whether the A/B runs is a function of the run, never of the wall time of a noisy
        block: its least version (per precision one observed pass, `compare.MIN_ROUNDS` timed
        rounds and the per-module forwards) runs whatever the budget; the budget
        (``precision_ab_budget_s``, at most 5% of the block) bounds only the rounds beyond it
        and the timing of an emulated precision other than the run's own. FP8 asked for
        explicitly (``fp8=True``) runs whatever the budget. What the budget decided is stated
        (``budget_note``), and every surface shows it beside the verdict.
        """
        config = run.config
        device = model_device(copy)
        precisions = supported_precisions(device)
        fp8 = config.fp8
        if fp8 or (fp8 is None and device_has_fp8(device)):
            precisions = [*precisions, "fp8"]
        if config.precision_ab_budget_s <= 0:  # the A/B is off: the probe's two precisions
            precisions = ["fp32", own]
        budget = max(0.0, min(config.precision_ab_budget_s, BLOCK_SHARE * (
            time.perf_counter() - self._began)))  # fmt: skip
        with internal_work():  # other blocks' hooks must not take the copy for a new model
            found = compare(
                copy,
                inputs[0],
                budget_s=budget,
                copy_model=False,
                kwargs=inputs[1],
                tolerance=TOLERANCE,
                min_samples=max(1, config.speed_probe_repeats),
                droppable=[p for p in precisions if p != own],
                precisions=precisions,
                fp8_recipe=config.fp8_recipe,
                keep=own,
                fp8_required=fp8 is True,
            ).to_dict()
        figures = {**probe_figures(found, own), "autocast": self._autocast}
        if config.precision_ab_budget_s <= 0:
            return {**figures, "precisions": {"skipped": "disabled (precision_ab_budget_s=0)"}}
        note = budget_note(found, budget)
        if note:
            found["budget_note"] = note
        return {**figures, "precisions": found}

    def section(self) -> SpeedProbeSection | None:
        """The timings (or why there are none) and the batch size seen."""
        if self._run is None:
            return None
        # the probe's timings are `SpeedProbeSection` keys (checked by the contract test)
        return cast(
            "SpeedProbeSection",
            {"batch_size": self._batch, "skipped": self._skipped, **self._result},
        )


def widened(value: Any, depth: int = 4) -> Any:
    """The captured inputs with every FP16/BF16 tensor as FP32 (in tuples, lists, dicts).

    A recurrent model carries its state from step to step (an LSTM's hidden state, made under
    autocast, so BF16): fed back as captured, the FP32 pass mixes an FP32 weight with a BF16
    state and fails. As FP32 both passes run: autocast casts them down again where its policy
    says, as it does for the first step's FP32 state.
    """
    if isinstance(value, torch.Tensor):
        low = value.dtype in (torch.float16, torch.bfloat16)
        return value.detach().float().requires_grad_(value.requires_grad) if low else value
    if depth <= 0:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(widened(v, depth - 1) for v in value)
    if isinstance(value, list):
        return [widened(v, depth - 1) for v in value]
    if isinstance(value, dict) and type(value) is dict:
        return {k: widened(v, depth - 1) for k, v in value.items()}
    return value


def budget_note(found: dict[str, Any], budget: float) -> str | None:
    """What the A/B's budget decided, in one sentence (None when it decided nothing).

    The least version ran over the budget; precisions left untimed; an FP8 readiness skipped,
    or run past the budget because it was asked for.
    """
    parts = []
    spent = found.get("spent_s")
    if isinstance(spent, (int, float)) and spent > budget:
        parts.append(
            f"the precision A/B took {spent:.2f} s, over its budget of {budget:.2f} s "
            "(precision_ab_budget_s, at most 5% of the block): its least version (one observed, "
            "three timed and the per-module passes of FP32 and the run's precision) ran all the "
            "same"
        )
    untimed = [
        str(r.get("precision")).upper()
        for r in found.get("results") or []
        if isinstance(r, dict) and r.get("not_timed")
    ]
    if untimed:
        parts.append(f"{', '.join(untimed)} not timed (over the budget; numerics measured)")
    fp8 = found.get("fp8")
    if isinstance(fp8, dict) and fp8.get("skipped"):
        parts.append(f"FP8 readiness skipped: {fp8['skipped']}")
    return "; ".join(parts) or None


def probe_figures(found: dict[str, Any], own: str) -> dict[str, Any]:
    """The probe's figures: the A/B's FP32 row against the run's precision's row.

    The least times with their spreads (`timing.least`: half the gap to the second least) and
    the samples; ``ratio`` (autocast / FP32) with ``ratio_low`` and ``ratio_high``, the
    interval the rules compare with thresholds (`timing.quotient`); ``tight`` (whether both
    reached `TOLERANCE`);
    ``modules``, the leaf modules' forward times in both (the most slowed down first).
    """
    rows = {r.get("precision"): r for r in found.get("results") or []}
    fp32, amp = rows.get("fp32") or {}, rows.get(own) or {}
    f_all, a_all = fp32.get("times_ms") or [], amp.get("times_ms") or []
    if not f_all or not a_all:
        why = amp.get("error") or fp32.get("error") or found.get("skipped") or "nothing timed"
        return {"error": f"the precision A/B timed no FP32 and {own} pass: {why}"}
    # a precision timed in one round: its pass and the bound `estimate` allows it
    f = pc.estimate(fp32) or timing.least(f_all)
    a = pc.estimate(amp) or timing.least(a_all)
    ratio = timing.quotient(a, f) if f.median > 0 else None
    tolerance = TOLERANCE
    return {
        "measured": "forward + backward",
        "repeats": min(len(f_all), len(a_all)),
        "fp32_ms": round(f.median, 4),
        "fp32_ms_spread": round(f.spread, 4),
        "autocast_ms": round(a.median, 4),
        "autocast_ms_spread": round(a.spread, 4),
        "fp32_ms_all": f_all,
        "autocast_ms_all": a_all,
        **(
            {
                "ratio": round(ratio.median, 4),
                "ratio_low": round(ratio.low, 4),
                "ratio_high": round(ratio.high, 4),
            }
            if ratio is not None
            else {}
        ),
        "tight": timing.tight(f, tolerance) and timing.tight(a, tolerance),
        "tolerance": tolerance,
        "budget_s": found.get("budget_s"),
        "modules": [
            {"module": m["module"], "fp32_ms": m["fp32_ms"], "autocast_ms": m["ms"]}
            for m in amp.get("modules") or []
            if isinstance(m, dict) and "ms" in m
        ],
    }


def copy_of(model: torch.nn.Module) -> tuple[torch.nn.Module | None, str]:
    """A deep copy of the model for the probe's forwards, or None and why not.

    The extra forwards run on a copy so that nothing of the user's model changes: not its
    parameters, buffers or ``.grad``, and not the Python state its ``forward`` may keep (a
    counter, a cache). The copy is refused when it would take more than a quarter of the
    memory left on the model's device.
    """
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    free = _free_bytes(model)
    if free is not None and size > free // 4:
        return None, (
            f"the model ({size / 2**20:.0f} MiB) is too large to copy for the probe "
            f"({free / 2**20:.0f} MiB free): the probe runs on a copy, never on the user's model"
        )
    try:
        return copy.deepcopy(model), ""
    except Exception as exc:
        return None, (
            f"the model cannot be copied ({type(exc).__name__}: {str(exc)[:200]}): the probe "
            "runs on a copy, never on the user's model"
        )


def _free_bytes(model: torch.nn.Module) -> int | None:
    """Free memory on the model's device (CUDA: the driver's figure; CPU: MemAvailable)."""
    first = next(iter(model.parameters()), None)
    try:
        if first is not None and first.is_cuda:
            free, _ = torch.cuda.mem_get_info(first.device)
            return int(free)
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, RuntimeError):
        return None
    return None
