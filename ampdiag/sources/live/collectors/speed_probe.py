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
  removed its hooks, it deep-copies the model and runs the copy's forward and a backward of a
  surrogate loss (the sum of the floating outputs) with ``torch.autograd.grad`` -- which
  returns gradients without touching any ``.grad`` -- once under
  ``torch.autocast(enabled=False)`` and once under the autocast the run used, warm-up
  first, then ``speed_probe_repeats`` interleaved pairs (ABBA order), and more until both
  medians are known to within 5% (median absolute deviation over median, `ampdiag.timing`),
  as long as 10% of the block's wall time allows; never past ``speed_probe_budget_s`` (two
  pairs at least, so that every figure has a spread). Every figure is a median with its
  spread, never one sample, and the ratio's interval is what the two medians' intervals allow:
  a run on a loaded machine that cannot tell the two apart says so (``ratio_low`` /
  ``ratio_high`` straddle the threshold, and ``autocast-slower`` is reported as uncertain)
  instead of flipping from run to run. One more
  forward of each, with timing hooks on the leaf modules, gives the per-module times.
- The extra forwards run on the copy, never on the user's objects: the user's parameters,
  buffers, ``.grad`` and the Python state a ``forward`` may keep (a step counter, a cache) are
  untouched. The copy is skipped, with the reason, when it is impossible or would take more
  than a quarter of the device's free memory. The CPU and CUDA random number generators are
  forked (``torch.random.fork_rng``), so dropout draws nothing the training would see.
  Training after the block is bit-identical to training without it.

It does not run under torch.distributed with several ranks (extra forwards on one rank would
desynchronise DDP/FSDP collectives), when the block raised, or with ``speed_probe=False``.
Forward hooks the user registered as plain functions on the model are copied by reference, so
they do see the probe's extra forwards (on the copy).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import torch

from ampdiag import timing
from ampdiag.analysis.precision_choice import run_precision
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
from ampdiag.sources.live.compare import (
    PASSES_PER_PRECISION,
    compare,
    model_device,
    supported_precisions,
)
from ampdiag.sources.live.discovery import dominant_autocast
from ampdiag.sources.live.passes import class_forward

TOP_MODULES = 15
#: Stop timing once both medians' spreads (MAD) are at most this share of them.
TOLERANCE = 0.05
#: The timed pairs' wall-time budget when none is given (`DiagnoseConfig.speed_probe_budget_s`).
DEFAULT_BUDGET_S = 10.0
#: Share of the block's wall time the timed pairs may spend at most.
BLOCK_SHARE = 0.1
#: Timed pairs at most, however noisy.
MAX_PAIRS = 50


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
        return cls(config.speed_probe_repeats, config.speed_probe_budget_s)

    def __init__(self, repeats: int = 5, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.repeats = max(1, repeats)
        self.budget_s = budget_s
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
        """Runs the probe on a copy of the model, unless the block failed or it cannot."""
        inputs, self._inputs = self._inputs, None
        raised = run.block_raised
        if raised is None:
            raised = sys.exc_info()[1] is not None
        model = self._model
        self._autocast = dominant_autocast(run.autocast)
        if not run.config.speed_probe:
            self._skipped = "disabled (speed_probe=False)"
        elif raised:
            self._skipped = "the block raised: no extra work after an error"
        elif model is None:
            self._skipped = "no model was found"
        elif self._autocast is None:
            self._skipped = "no forward ran under autocast"
        elif inputs is None:
            self._skipped = "no forward ran on a sampled step"
        elif _is_distributed(model):
            self._skipped = "distributed run: extra forwards would desynchronise the ranks"
        if self._skipped is not None or model is None or inputs is None or self._autocast is None:
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
        device, dtype_name = self._autocast.split(":", 1)
        extra = min(self.budget_s, BLOCK_SHARE * (time.perf_counter() - self._began))
        self._probing = True
        try:
            with internal_work():  # other blocks' hooks must not take the copy for a new model
                self._result = probe(
                    copy,
                    inputs[0],
                    inputs[1],
                    device,
                    getattr(torch, dtype_name),
                    self.repeats,
                    budget_s=self.budget_s,
                    extra_s=extra,
                )
            self._result["autocast"] = self._autocast
            self._result["precisions"] = self._compare(run, copy, inputs)
        except Exception as exc:  # the probe must never cost the user the report
            self._result = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self._probing = False
            del copy

    def _compare(
        self,
        run: RunContext,
        copy: torch.nn.Module,
        inputs: tuple[tuple[Any, ...], dict[str, Any]],
    ) -> dict[str, Any]:
        """Every precision measured on the copy (`ampdiag.compare`), its least version always.

        Whether the A/B runs is a function of the run, never of the wall time of a noisy
        block: it runs whenever the probe did (and ``precision_ab_budget_s`` > 0). Its least
        version (per precision one observed pass, `compare.MIN_ROUNDS` timed rounds and the
        per-module forwards) runs whatever the budget; the budget (``precision_ab_budget_s``,
        at most 10% of the block) bounds only the rounds beyond it and the timing of a
        precision the probe did not time. FP8 asked for explicitly (``fp8=True``) runs whatever
        the budget. What the budget decided is stated (``budget_note``), and every surface
        shows it beside the verdict.
        """
        if run.config.precision_ab_budget_s <= 0:
            return {"skipped": "disabled (precision_ab_budget_s=0)"}
        budget = min(
            run.config.precision_ab_budget_s, BLOCK_SHARE * (time.perf_counter() - self._began)
        )
        precisions = supported_precisions(model_device(copy))
        need = ab_cost_estimate_s(self._result, len(precisions))
        fp8 = run.config.fp8
        if fp8 or (fp8 is None and device_has_fp8(model_device(copy))):
            precisions = [*precisions, "fp8"]
        try:
            with internal_work():
                found = compare(
                    copy,
                    inputs[0],
                    budget_s=budget,
                    copy_model=False,
                    kwargs=inputs[1],
                    # a precision the probe did not time may be far slower than assumed
                    droppable=[p for p in precisions if p != run_precision(self._autocast)],
                    precisions=precisions,
                    fp8_recipe=run.config.fp8_recipe,
                    keep=run_precision(self._autocast) or "fp32",
                    fp8_required=fp8 is True,
                ).to_dict()
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        note = budget_note(found, budget, need)
        if note:
            found["budget_note"] = note
        return found

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


def budget_note(found: dict[str, Any], budget: float, need: float | None) -> str | None:
    """What the A/B's budget decided, in one sentence (None when it decided nothing).

    The least version ran over a budget it did not fit; precisions left untimed; an FP8
    readiness skipped, or run past the budget because it was asked for.
    """
    parts = []
    spent = found.get("spent_s")
    over = isinstance(spent, (int, float)) and spent > budget
    if over or (need is not None and need > budget):
        # what was over the budget: the time it took, or (where it fitted) the estimate before
        took = f"took {spent:.2f} s, over" if over else "ran over"
        if not over and need is not None:
            took = f"needed an estimated {need:.2f} s, over"
        parts.append(
            f"the precision A/B {took} its budget of {budget:.2f} s "
            "(precision_ab_budget_s, at most 10% of the block): its least version (one observed, "
            "two timed and the per-module passes of each precision) ran all the same, with no "
            "extra rounds"
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


def ab_cost_estimate_s(timings: dict[str, Any], precisions: int) -> float | None:
    """The least the precision A/B can cost, from the probe's own measured medians.

    Each precision costs `compare.PASSES_PER_PRECISION` passes (observed, two timed rounds,
    per-module forwards): FP32 and the run's autocast at the times the probe measured, any
    other at the slower of the two. The A/B is skipped, with this figure, when even that is
    over its budget: its cost stays bounded by the budget instead of overrunning it. A
    precision the probe did not time can be far slower than that (FP16 without native FP16); the
    A/B drops it from timing once its observed pass predicts an overrun (``droppable``).
    """
    fp32, amp = timings.get("fp32_ms"), timings.get("autocast_ms")
    if not isinstance(fp32, (int, float)) or not isinstance(amp, (int, float)):
        return None
    slowest = max(fp32, amp) / 1e3
    known = (fp32 + amp) / 1e3
    return PASSES_PER_PRECISION * (known + slowest * max(0, precisions - 2))


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


def probe(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: str,
    dtype: torch.dtype,
    repeats: int = 5,
    budget_s: float = DEFAULT_BUDGET_S,
    extra_s: float | None = None,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Times ``model(*args, **kwargs)`` + a surrogate backward in FP32 and under autocast.

    One warm-up pair, then ``repeats`` interleaved pairs (ABBA order), and more until both
    medians are known to within ``tolerance`` (spread over median, `ampdiag.timing`) or
    ``extra_s`` is spent; never past ``budget_s`` (two pairs at least, so that every figure has
    a spread) nor `MAX_PAIRS`. The ratio is the quotient of the two medians, its interval the
    quotient of their intervals (`timing.quotient`).
    Parameters, their ``.grad``, buffers and the RNG state are unchanged afterwards.

    Args:
        model: The model (left in its train/eval mode).
        args: Positional inputs of a real forward.
        kwargs: Keyword inputs of a real forward.
        device: The autocast device type ("cpu" or "cuda").
        dtype: The autocast dtype.
        repeats: Timed pairs at least (within ``budget_s``).
        budget_s: Wall time the timed pairs may spend in all (after the warm-up pair).
        extra_s: Wall time after which no pair is added beyond ``repeats`` (default
            ``budget_s``).
        tolerance: Stop once both medians' spreads are at most this share of them.

    Returns:
        ``fp32_ms`` and ``autocast_ms`` (medians) with their ``*_spread`` (median absolute
        deviation); ``ratio`` (autocast / FP32) with ``ratio_low`` and ``ratio_high`` (the
        interval the rules compare with thresholds); ``tight`` (whether the tolerance was
        reached), ``repeats`` (pairs timed), all samples, ``measured`` (what was timed) and
        ``modules`` (per leaf module forward times).
    """
    cuda_devices = sorted({t.device.index or 0 for t in model.parameters() if t.is_cuda})
    once = _Pass(model, args, kwargs, device, dtype, bool(cuda_devices) or device == "cuda")
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    with (
        torch.random.fork_rng(devices=cuda_devices if torch.cuda.is_available() else []),
        class_forward(model),
    ):
        try:
            once(False)
            once(True)
            fp32, amp = _interleaved(
                once, repeats, budget_s, budget_s if extra_s is None else extra_s, tolerance
            )
            modules = _module_times(model, args, kwargs, device, dtype, once.sync)
        finally:
            with torch.no_grad():
                for buf, value in saved:
                    buf.copy_(value)
    f, a = timing.estimate(fp32), timing.estimate(amp)
    r = timing.quotient(a, f) if f.median > 0 else None
    return {
        "measured": "forward + backward" if once.params else "forward",
        "repeats": len(fp32),
        "fp32_ms": round(f.median, 4),
        "fp32_ms_spread": round(f.spread, 4),
        "autocast_ms": round(a.median, 4),
        "autocast_ms_spread": round(a.spread, 4),
        "fp32_ms_all": [round(x, 4) for x in fp32],
        "autocast_ms_all": [round(x, 4) for x in amp],
        **(
            {
                "ratio": round(r.median, 4),
                "ratio_low": round(r.low, 4),
                "ratio_high": round(r.high, 4),
            }
            if r is not None
            else {}
        ),
        "tight": timing.tight(f, tolerance) and timing.tight(a, tolerance),
        "tolerance": tolerance,
        "budget_s": round(budget_s, 3),
        "modules": modules,
    }


class _Pass:
    """One timed forward (+ surrogate backward) of the model, with autocast on or off: seconds.

    The backward is ``torch.autograd.grad`` of the sum of the floating outputs: no ``.grad``
    changes.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        device: str,
        dtype: torch.dtype,
        cuda: bool,
    ) -> None:
        self.model, self.args, self.kwargs = model, args, kwargs
        self.device, self.dtype, self.cuda = device, dtype, cuda
        self.params = [p for p in model.parameters() if p.requires_grad]

    def sync(self) -> None:
        """Waits for the GPU (a timing must hold the device's work, not just its launch)."""
        if self.cuda and torch.cuda.is_available():
            torch.cuda.synchronize()

    def __call__(self, amp: bool) -> float:
        self.sync()
        t0 = time.perf_counter()
        with torch.autocast(self.device, dtype=self.dtype, enabled=amp):
            out = self.model(*self.args, **self.kwargs)
        if self.params:
            loss = sum(
                t.float().sum()
                for t in tensors_in(out)
                if t.is_floating_point() and t.requires_grad
            )
            if isinstance(loss, torch.Tensor):
                torch.autograd.grad(loss, self.params, allow_unused=True)
        del out
        self.sync()
        return time.perf_counter() - t0


def _interleaved(
    once: _Pass, repeats: int, budget_s: float, extra_s: float, tolerance: float
) -> tuple[list[float], list[float]]:
    """FP32 and autocast times (ms), in interleaved ABBA pairs, until `probe`'s stop rule."""
    fp32: list[float] = []
    amp: list[float] = []
    began = time.perf_counter()
    while True:
        order = (False, True) if len(fp32) % 2 == 0 else (True, False)
        for autocast_on in order:
            (amp if autocast_on else fp32).append(once(autocast_on) * 1000)
        n, spent = len(fp32), time.perf_counter() - began
        done = all(timing.tight(timing.estimate(x), tolerance) for x in (fp32, amp))
        over = spent >= budget_s and n >= timing.MIN_SAMPLES
        if over or n >= MAX_PAIRS or (n >= repeats and done):
            return fp32, amp
        if n >= repeats and spent >= extra_s:
            return fp32, amp


def _module_times(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: str,
    dtype: torch.dtype,
    sync: Callable[[], None],
) -> list[dict[str, Any]]:
    """Forward time of each leaf module in FP32 and under autocast (one pass each, no grad)."""
    leaves = [
        (n or type(model).__name__, m)
        for n, m in model.named_modules()
        if not any(True for _ in m.children())
    ]
    times: dict[str, list[float]] = {n: [0.0, 0.0] for n, _ in leaves}
    started: dict[int, float] = {}
    slot = [0]
    handles = []

    def pre(module: torch.nn.Module, inputs: Any) -> None:
        sync()
        started[id(module)] = time.perf_counter()

    def make_post(name: str) -> Callable[..., None]:
        def post(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            sync()
            t0 = started.pop(id(module), None)
            if t0 is not None:
                times[name][slot[0]] += (time.perf_counter() - t0) * 1000

        return post

    try:
        for name, module in leaves:
            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(make_post(name)))
        with torch.no_grad():
            for index, amp in enumerate((False, True)):
                slot[0] = index
                with torch.autocast(device, dtype=dtype, enabled=amp):
                    model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    ranked = sorted(
        ((n, t) for n, t in times.items() if t[0] > 0 or t[1] > 0),
        key=lambda item: item[1][1] - item[1][0],
        reverse=True,
    )
    return [
        {"module": n, "fp32_ms": round(t[0], 4), "autocast_ms": round(t[1], 4)}
        for n, t in ranked[:TOP_MODULES]
    ]
