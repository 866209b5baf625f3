"""``ampdiag.compare``: which precision for this model on this device, measured on its own batch.

For every precision the device runs — FP32, BF16 autocast, FP16 autocast with a loss scale as a
GradScaler applies it (and TF32 matmuls on CUDA) — it measures one forward + backward of the
user's model on the user's batch:

- **time**: interleaved rounds (every precision once per round, the order rotated), on a CPU
  in process CPU time (`CLOCK`), repeated until each precision's two least passes agree
  within ``tolerance`` (`timing.least`: another process only adds time, so the least pass is
  the least disturbed) or the time budget is spent; the least time and the interval up to the
  second least are reported, and a speed-up is called only when the interval of the ratio
  (`timing.quotient`) is wholly beyond 1. From
  the second round on, a clear loser (every sample over 3x the fastest's slowest) leaves
  the rounds with the samples it has;
- **memory**: on CUDA the peak allocated above the start; everywhere, the bytes autograd saves
  for backward (activation memory: what autocast can shrink), counted with
  ``torch.autograd.graph.saved_tensors_hooks``;
- **error against FP32**: the loss difference, and the signal-to-quantization-noise ratio (SQNR,
  dB) of every leaf module's output and of every parameter's gradient — the worst and the
  median; and the **underflow** each would have: gradient values that are zero in that
  precision but not in FP32;
- **where a low precision loses time**, per leaf module: its forward time in FP32 and in the
  low precision, and how much of the latter the casts take (``_to_copy`` ops inside the
  module, timed in a separate pass): the rest is the low-precision kernels themselves.

The recommendation is `analysis.precision_choice.choose`: the precision in use (``keep``: FP32
by default, the run's own under ``diagnose()``) unless a numerically safe one (its ``SAFETY``
criterion) is measured clearly faster (the lower end of its speed-up interval at least
``SWITCH_SPEEDUP``).

Observe, never change: all of it runs on a deep copy of the model (parameters, buffers and any
Python state the forward touches stay the user's), with the random number generators forked
and seeded alike for every precision, so dropout draws the same masks in each and nothing the
training would see. Global modes it sets (TF32) are restored.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import statistics
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ampdiag import timing
from ampdiag.analysis import precision_choice
from ampdiag.compat.autocast import dispatch_mode_class
from ampdiag.compat.dispatch import op_name
from ampdiag.sources.live.collectors.base import graph_nodes, tensors_in
from ampdiag.sources.live.environment import bf16_native, fp16_native
from ampdiag.sources.live.passes import class_forward, sqnr_db

#: The loss scale of the FP16 measurement (a GradScaler's default ``init_scale``).
FP16_LOSS_SCALE = 2.0**16
DEFAULT_BUDGET_S = 20.0
#: A precision whose first timed pass is this many times the fastest one's least is timed no
#: more (`_still_racing`): one round, its row saying so (``one_round``). See
#: `precision_choice.ONE_ROUND`: timing it again only spends the exit (an emulated BF16 UNet
#: pass: 150 ms against FP32's 40, twice more at every exit).
OUT_OF_RACE = precision_choice.ONE_ROUND
#: Halvings of the FP16 loss scale tried after an overflow (as a GradScaler backs off).
MAX_BACKOFFS = 24
#: Leaf modules kept per low precision in the per-module costs (the most slowed down first).
TOP_MODULES = 8
#: Passes of forward + backward one observed run costs: the run, and its hooks copying every
#: leaf module's output and counting the saved tensors (about half a pass more).
OBSERVED_PASSES = 1.5
#: Timed rounds every precision still racing gets at the least, budget or not: a median with a
#: spread that one stalled sample cannot move (`timing`: with two, a stall is half the samples,
#: and the demo's FP16-on-CPU verdict flipped between identical runs at load 1.5).
MIN_ROUNDS = 3
#: A speed claim whose lower end lies within this factor of `precision_choice.SWITCH_SPEEDUP`
#: (either side: 0.88x-1.37x) rests on the bar, where the few passes of the least version move
#: it across: the rounds go on, up to `MAX_ROUNDS` (`_on_the_bar`), past the budget while a
#: round costs under `BAR_ROUND_S`. A native BF16 tied with FP32 on the corpus's CNN
#: (0.96-0.98x, the least of 30 warm passes each, 60 copies) had one of the two clearly
#: faster (a lower end of 1.10x or more) in 3 of 150 A/Bs of three rounds beside a busy core,
#: in 1 of 150 of six; the scenario itself, 1 in 40 at three (1.34x: three BF16 passes slowed
#: while FP32's were not), none in 40 since.
NEAR_BAR = 1.25
#: The rounds a claim on the bar may take, at most: twice the least version.
MAX_ROUNDS = 2 * MIN_ROUNDS
#: A round on the bar past the budget only while its passes' least times (on the A/B's clock:
#: CPU time on a CPU, wall time on a GPU) add up to less than this. The millisecond passes
#: whose least one time slice moves most cost little to repeat, and so does the real
#: denoising-diffusion Trainer's UNet (~60 ms a round), whose BF16 takes 1.14-1.20x FP32's
#: time (the least of 15 warm passes each): on the bar. With three rounds its verdict was
#: "healthy" (tied) in 2 of 3 runs at load 3 and "slow, prefer FP32" in one; with six, "slow,
#: prefer FP32" in 4 of 4, the exit's CPU time 1.02-1.23 s against 0.97-1.34. A 200 ms pass's
#: round (which load moves proportionally less) waits for the budget. Not a wall time on a
#: CPU, even the least: at load 3.7 on two cores the UNet's least walls passed 100 ms, its
#: rounds stopped at three, and the verdict said "healthy" again. A forward that waits (I/O,
#: a sleep) costs its wait beside that.
BAR_ROUND_S = 0.1
#: A timed pass's clock on a CPU: process CPU time, which another process holding the core
#: does not stretch (a 3 ms GRU pass measured 7-14 ms of wall time at load 4). GPU: wall time.
CLOCK = time.process_time
#: The per-module forwards of a precision (`_module_costs`: two forwards, one of them in a
#: dispatch mode), in passes of forward + backward.
MODULE_PASSES = 0.7


@dataclass
class PrecisionResult:
    """One precision's measurements (times in ms, memory in bytes, SQNR in dB)."""

    precision: str
    time_ms: float | None = None
    time_spread_ms: float | None = None
    samples: int = 0
    #: The timed rounds' times (ms), in the order they ran.
    times_ms: list[float] = field(default_factory=list)
    saved_bytes: int | None = None
    peak_bytes: int | None = None
    loss: float | None = None
    loss_rel_diff: float | None = None
    output_sqnr_db_min: float | None = None
    output_sqnr_db_median: float | None = None
    worst_output_module: str | None = None
    grad_sqnr_db_min: float | None = None
    grad_sqnr_db_median: float | None = None
    worst_grad_param: str | None = None
    grad_underflow: float | None = None
    nonfinite: bool = False
    loss_scale: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    activation_saving: float | None = None
    peak_saving: float | None = None
    faster: bool | None = None
    safe: bool | None = None
    unsafe_reasons: list[str] = field(default_factory=list)
    modules: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    not_timed: str | None = None
    #: Not run at all, and why (`emulated_fp16`): no numerics, no time.
    not_run: str | None = None
    #: Timed in one round only (`OUT_OF_RACE`): its pass over the fastest precision's least.
    one_round: float | None = None


@dataclass
class PrecisionComparison:
    """What `compare` measured, and the precision it recommends."""

    device: str
    batch_size: int | None
    results: list[PrecisionResult] = field(default_factory=list)
    recommended: str | None = None
    tied: list[str] = field(default_factory=list)
    uncertain: bool = False
    reason: str = ""
    criteria: dict[str, float] = field(default_factory=lambda: dict(precision_choice.SAFETY))
    budget_s: float = DEFAULT_BUDGET_S
    spent_s: float = 0.0
    skipped: str | None = None
    #: FP8 readiness (`sources.live.fp8.readiness`), when ``"fp8"`` was asked for.
    fp8: dict[str, Any] | None = None

    def result(self, precision: str) -> PrecisionResult:
        """One precision's row."""
        for r in self.results:
            if r.precision == precision:
                return r
        raise KeyError(precision)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the session's ``precision_ab`` section)."""
        return asdict(self)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's parameters (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def supported_precisions(device: torch.device) -> list[str]:
    """FP32 and the low precisions this device runs (TF32 on CUDA GPUs that have it)."""
    out = ["fp32"]
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major >= 8:
            out.append("tf32")
        if major >= 8:  # below, torch emulates BF16 (is_bf16_supported() says True there)
            out.append("bf16")
        out.append("fp16")
    else:
        out += ["bf16", "fp16"]
    return out


def native(name: str, device: torch.device) -> bool:
    """Whether ``device`` runs precision ``name`` in its own kernels (never converted to FP32).

    A native precision is a contender whatever its first, observed pass took: that pass is
    cold (oneDNN creates a BF16 convolution's primitives on it; 6 ms against a warm 1.2 ms on
    the corpus's CNN, `affordable`), so only an emulated precision is ever left untimed for
    the budget. FP32 is the reference; TF32 is listed only on GPUs that have it.
    """
    if name == "bf16":
        return bf16_native(device)
    if name == "fp16":
        return fp16_native(device)
    return True


def _default_precisions(device: torch.device) -> list[str]:
    """`supported_precisions`, and FP8 where the device computes it natively."""
    from ampdiag.compat import fp8 as cfp8

    return supported_precisions(device) + (["fp8"] if cfp8.device_has_fp8(device) else [])


@contextmanager
def _precision(name: str, device: torch.device) -> Iterator[None]:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        if name == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
        elif device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@contextmanager
def _seeded(device: torch.device, seed: int) -> Iterator[None]:
    """The CPU's random number generator, and a CUDA model's device's, forked and seeded.

    Every pass starts from the same seed (dropout draws the same masks in each precision), and
    the user's generators are as they were afterwards. Not ``torch.manual_seed``: on a process
    that has not started CUDA it also queues a seed for every CUDA device, applied whenever
    CUDA starts (outside the fork: the user's CUDA generators would start from the A/B's seed),
    and records the caller's stack for that queue each time (2 ms a pass; 24 ms of a
    nanoGPT-style exit).
    """
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.default_generator.manual_seed(seed)
        if cuda:
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def _leaves(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if not any(m.children()) and n]


class _Runner:
    """One model copy and batch; runs forward + backward in a precision and keeps what it saw."""

    def __init__(
        self,
        model: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        loss_fn: Callable[[Any], torch.Tensor],
        device: torch.device,
        seed: int,
    ) -> None:
        self.model, self.args, self.kwargs = model, args, kwargs
        self.loss_fn, self.device, self.seed = loss_fn, device, seed
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.fp16_scale = FP16_LOSS_SCALE
        #: FP32's largest gradient value (set from its observed run): where FP16's loss-scale
        #: search starts (`_grads`).
        self.grad_peak = 0.0
        #: The largest BF16 gradient value its observed backward computed (`_low_peaks`): the
        #: values FP16 computes in the same ops, so a closer start than ``grad_peak``.
        self.low_peak = 0.0
        #: Wall time of the last observed run's backed-off backwards (not part of a pass).
        self.backoff_s = 0.0
        #: Whether FP16 is measured: only then does BF16's observed backward record
        #: ``low_peak`` (a hook on every node of its graph) for FP16's loss-scale search.
        self.fp16 = True

    def _grads(self, loss: torch.Tensor, scale: float, retry: bool) -> tuple[Any, ...]:
        """Gradients of ``loss * scale``; with ``retry``, backing the scale off as a GradScaler.

        A GradScaler whose scaled gradients overflow skips the step and halves its scale; the
        scale it settles at is the largest power of two at which they are finite. With
        ``retry`` that scale is searched among ``scale``, ``scale / 2``, ... down to 1
        (`MAX_BACKOFFS` at most; the graph kept) and kept for the timed runs. The overflowed
        backwards' time is kept apart (``backoff_s``): a timed run does one backward.

        The search halves the range (`_largest_finite`), not the scale one step at a time: the
        same scale a step-by-step backoff reaches, in at most 1 + log2(candidates) backwards
        (5 for 2**16 down to 1) instead of one per halving. One FP16 backward on a CPU without
        native FP16 costs several FP32 ones, and a surrogate loss can need a dozen halvings:
        that was most of the A/B's time at exit. It starts at the scale the gradients BF16
        computed predict (``low_peak``: the largest scale at which they stay within FP16's
        range; FP32's, ``grad_peak``, when BF16 did not run): two backwards (that scale finite,
        twice it not) where the prediction holds. FP32's gradients are the parameters'
        (an embedding's or a norm's too, computed in FP32 under autocast) and predicted a
        nanoGPT-style model's scale two halvings short.
        """
        wrt = [p for _, p in self.params]
        self.backoff_s = 0.0
        if not retry or not math.isfinite(float(loss.detach())):
            return torch.autograd.grad(loss * scale, wrt, allow_unused=True)
        scales = [scale]
        while scales[-1] > 1.0 and len(scales) < MAX_BACKOFFS:
            scales.append(scales[-1] / 2)
        spent = [0.0]
        # (index, gradients, seconds) of the largest finite scale found so far: each finite
        # one the search finds is at a larger scale than those before it, so one set is kept
        kept: list[tuple[int, tuple[Any, ...], float]] = []

        def backward(index: int) -> tuple[tuple[Any, ...], float]:
            t0 = time.perf_counter()
            got = torch.autograd.grad(
                loss * scales[index], wrt, allow_unused=True, retain_graph=True
            )
            took = time.perf_counter() - t0
            spent[0] += took
            return got, took

        def finite(index: int) -> bool:
            got, took = backward(index)
            ok = all(g is None or _finite(g) for g in got)
            if ok:
                kept[:] = [(index, got, took)]
            return ok

        start = 0
        peak = self.low_peak or self.grad_peak
        if 0 < peak < math.inf:
            fits = math.floor(math.log2(torch.finfo(torch.float16).max / peak))
            start = min(len(scales) - 1, max(0, round(math.log2(scale)) - fits))
        chosen = _largest_finite(len(scales), finite, start)
        if kept and kept[0][0] == chosen:
            _, grads, took = kept[0]
        else:  # none was finite: the smallest scale, where a GradScaler's backoff ends
            grads, took = backward(chosen)
        # one backward is the pass's; every other one is the backoff's
        self.backoff_s = spent[0] - took
        self.fp16_scale = scales[chosen]
        return grads

    def run(
        self, precision: str, observe: bool
    ) -> tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int]:
        """Loss, leaf outputs (when observing), gradients, saved-for-backward bytes."""
        outputs: dict[str, torch.Tensor] = {}
        handles = []
        if observe:
            for name, module in _leaves(self.model):

                def hook(_m: Any, _i: Any, out: Any, name: str = name) -> None:
                    first = next((t for t in tensors_in(out) if t.is_floating_point()), None)
                    if first is not None:
                        outputs[name] = first.detach().float().clone()

                handles.append(module.register_forward_hook(hook))
        saved: dict[int, int] = {}
        param_ids = {id(p) for _, p in self.params}
        param_storages = {p.untyped_storage().data_ptr() for p in self.model.parameters()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            # parameters, views of them (a Linear saves weight.t()) and their autocast copies
            # are weights, not activations
            if observe and not _is_param_cast(t, param_ids):
                storage = t.untyped_storage()
                if storage.data_ptr() not in param_storages:
                    saved[storage.data_ptr()] = storage.nbytes()
            return t

        try:
            with _seeded(self.device, self.seed):
                # Timed runs carry no hook: they cost what the user's step would.
                counting = (
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
                    if observe
                    else contextlib.nullcontext()
                )
                with (
                    counting,
                    _precision(precision, self.device),
                    class_forward(self.model),  # a forward wrapped in autocast: unwrapped
                ):
                    loss = self.loss_fn(self.model(*self.args, **self.kwargs)).float()
                scale = self.fp16_scale if precision == "fp16" else 1.0
                peaks: list[torch.Tensor] = []
                if observe and precision == "bf16" and self.fp16:
                    handles += _low_peaks(loss.grad_fn, torch.bfloat16, peaks)
                grads = self._grads(loss, scale, retry=observe and precision == "fp16")
                if peaks:
                    self.low_peak = float(torch.stack(peaks).float().max())
                if precision == "fp16" and observe:
                    scale = self.fp16_scale
        finally:
            for h in handles:
                h.remove()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out_grads = (
            [
                (g.float() / scale) if g is not None else torch.zeros_like(p, dtype=torch.float32)
                for g, (_, p) in zip(grads, self.params, strict=True)
            ]
            if observe
            else []
        )
        return float(loss.detach()), outputs, out_grads, sum(saved.values())

    def module_times(self, precision: str, casts: bool) -> dict[str, float]:
        """Per leaf module, the forward's time (ms) in ``precision``, or its casts' time.

        ``casts=False``: wall time between the module's forward pre- and post-hook.
        ``casts=True``: the time of the casts (``_to_copy`` from one floating-point dtype to
        another: autocast's of inputs and weights) inside each module, timed one by one in a
        dispatch mode -- a separate pass, since the mode's overhead would inflate the modules'
        times. An index or mask made a float, or a copy keeping the dtype, happens in FP32 too:
        no cast of a precision (an FP32 pass once subtracted such casts, at more than an FP32
        forward's cost on a many-leaf model).
        """
        times: dict[str, float] = {}
        stack: list[str] = []
        began: dict[str, float] = {}
        cuda = self.device.type == "cuda"

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(self.device)

        def pre(name: str) -> Callable[..., None]:
            def hook(_m: Any, _i: Any) -> None:
                stack.append(name)
                if not casts:
                    sync()
                    began[name] = time.perf_counter()

            return hook

        def post(name: str) -> Callable[..., None]:
            def hook(_m: Any, _i: Any, _o: Any) -> None:
                if stack and stack[-1] == name:
                    stack.pop()
                if not casts and name in began:
                    sync()
                    times[name] = times.get(name, 0.0) + (time.perf_counter() - began.pop(name))

            return hook

        class CastTimer(dispatch_mode_class()):  # type: ignore[misc]
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                x: Any = args[0] if args else None
                cast = stack and op_name(func)[0] == "_to_copy" and isinstance(x, torch.Tensor)
                if not cast or not x.is_floating_point():
                    return func(*args, **(kwargs or {}))
                sync()
                t0 = time.perf_counter()
                out = func(*args, **(kwargs or {}))
                sync()
                if out.is_floating_point() and out.dtype != x.dtype:
                    times[stack[-1]] = times.get(stack[-1], 0.0) + (time.perf_counter() - t0)
                return out

        handles = []
        try:
            for name, module in _leaves(self.model):
                handles.append(module.register_forward_pre_hook(pre(name)))
                handles.append(module.register_forward_hook(post(name)))
            with (
                _seeded(self.device, self.seed),
                _precision(precision, self.device),
                class_forward(self.model),
                CastTimer() if casts else contextlib.nullcontext(),
            ):
                self.model(*self.args, **self.kwargs)
        finally:
            for h in handles:
                h.remove()
        return {n: t * 1000 for n, t in times.items()}


def _low_peaks(root: Any, dtype: torch.dtype, peaks: list[torch.Tensor]) -> list[Any]:
    """Hooks on every node of a backward's graph: each ``dtype`` gradient's largest value.

    Appended to ``peaks`` as tensors (one host sync in all, after the backward). Returns the
    hooks' handles. The nodes' outputs are the gradients autocast computes in the low
    precision; a gradient accumulator has none.
    """
    handles: list[Any] = []

    def hook(grad_inputs: tuple[Any, ...], _grad_outputs: tuple[Any, ...]) -> None:
        for g in grad_inputs:
            if isinstance(g, torch.Tensor) and g.dtype == dtype and g.numel():
                peaks.append(g.detach().abs().amax())

    for node in graph_nodes(root):
        if type(node).__name__ != "AccumulateGrad":
            handles.append(node.register_hook(hook))
    return handles


def _largest_finite(count: int, finite: Callable[[int], bool], start: int = 0) -> int:
    """The first of ``count`` loss scales (largest first, halving) at which ``finite`` holds.

    ``finite(i)`` runs the backward at the ``i``-th scale. Whether FP16 gradients overflow is
    monotone in a power-of-two loss scale: multiplying by a power of two is exact in floating
    point short of overflow and underflow, so every value the backward computes grows with the
    scale and one that overflows at a scale overflows at every larger one. The ``start``-th
    scale first (by default the largest: the usual answer, one backward); when finite, larger
    ones 1, 2, 4, ... steps before it until one overflows, then halving the range between (a
    prediction a few scales short costs a few backwards, not a search of the whole range: on a
    nanoGPT-style model two short, 4 backwards instead of 6, each an FP16 backward that a CPU
    without native FP16 emulates). When ``start`` overflows, halving the range after it; when
    none is finite, the last (smallest) scale, without running it: a GradScaler's backoff ends
    there.
    """
    if count <= 1:
        return 0
    if finite(start):
        lo, hi, step = 0, start, 1  # hi is finite
        while lo < hi:
            probe = max(lo, hi - step)
            if not finite(probe):
                lo = probe + 1
                break
            hi, step = probe, step * 2
    else:
        lo, hi = min(start + 1, count - 1), count - 1  # hi, the smallest, if none is
    while lo < hi:
        mid = (lo + hi) // 2
        if finite(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _is_param_cast(t: torch.Tensor, param_ids: set[int], depth: int = 4) -> bool:
    """Whether ``t`` is made from a parameter alone: autocast's copy of a weight, or a view of it.

    Autograd records it: following ``grad_fn`` through nodes with a single input (``ToCopy``,
    ``T``, views) reaches the parameter's gradient accumulator, without meeting the batch.
    """
    fn = t.grad_fn
    for _ in range(depth):
        if fn is None:
            return False
        variable = getattr(fn, "variable", None)
        if variable is not None:
            return id(variable) in param_ids
        if len(fn.next_functions) != 1:  # an op of several inputs (the batch among them)
            return False
        fn = fn.next_functions[0][0]
    return False


def _default_loss(output: Any) -> torch.Tensor:
    floats = [t.float().sum() for t in tensors_in(output) if t.is_floating_point()]
    if not floats:
        raise ValueError("the model's output holds no floating-point tensor; pass loss_fn")
    return torch.stack(floats).sum()


def compare(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    *,
    target: Any = None,
    precisions: list[str] | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    tolerance: float = 0.05,
    min_samples: int = 3,
    seed: int = 0,
    kwargs: dict[str, Any] | None = None,
    copy_model: bool = True,
    droppable: Collection[str] = (),
    fp8_recipe: str = "tensorwise",
    keep: str = "fp32",
    fp8_required: bool = False,
) -> PrecisionComparison:
    """Measures FP32 against each low precision for this model and batch, changing nothing.

    Args:
        model: The model, on its device, in the mode it trains in (it is copied; the copy runs).
        batch: The model's input: a tensor, a tuple of positional arguments, or a dict of
            keyword arguments.
        loss_fn: ``loss_fn(output, target)`` when ``target`` is given, else ``loss_fn(output)``;
            default: the sum of the output's floating-point tensors (a surrogate whose backward
            exercises every op).
        target: The target passed to ``loss_fn``.
        precisions: Which to measure (default: every one the device supports; see
            `supported_precisions`). ``"fp8"`` adds the FP8 readiness of every ``nn.Linear``
            (``result.fp8``); by default only on a GPU with FP8 (compute capability >= 8.9).
        budget_s: Wall time the timing rounds may spend, in all.
        tolerance: Stop timing once every least time is known to within this share.
        min_samples: Timed samples of each precision at least (budget permitting; two even
            past the budget when ``min_samples >= 2``, so that every time has a spread).
        seed: The random seed every precision's forward starts from (dropout masks alike).
        kwargs: Keyword arguments of the model's forward, beside ``batch``.
        copy_model: Measure a deep copy (the default). ``False`` measures ``model`` itself:
            only for a model that is already a throwaway copy (the speed probe's).
        droppable: Precisions left untimed when their observed pass predicts that timing them
            would overrun ``budget_s`` (`affordable`); their row keeps its numerics and says
            why in ``not_timed``. Only an emulated one (`native`) is ever left untimed: FP32
            and a precision the device runs natively are always timed. The speed probe passes
            every precision but FP32 and the run's own (its figures).
            A droppable FP16 on a device that emulates it (`fp16_native`: a CPU without
            AVX512_FP16/AMX_FP16) is not run at all: no observed pass, no loss-scale search,
            no timing; its row says why in ``not_run`` (`emulated_fp16`).
        fp8_recipe: With ``"fp8"`` among ``precisions``: the scaling recipe of the FP8
            readiness (``tensorwise``, ``rowwise``, ``delayed``; see `sources.live.fp8`). It
            runs after the observed passes, inside the same budget, and is skipped with the
            reason when its estimated cost would not fit (unless ``fp8_required``).
        keep: The precision in use: recommended unless a safe one is measured clearly
            faster (`precision_choice.choose`).
        fp8_required: FP8 was asked for explicitly (``diagnose(fp8=True)``): its readiness
            runs whatever the budget, and the time it took is recorded.

    Returns:
        A `PrecisionComparison`: one row per precision, and the recommended one — the fastest
        whose numerics are safe (see `precision_choice`), with the reason.
    """
    started = time.perf_counter()
    device = model_device(model)
    args, named = _split_batch(batch, kwargs)
    first = next((t for t in tensors_in((args, named))), None)
    result = PrecisionComparison(
        device=str(device),
        batch_size=int(first.shape[0]) if first is not None and first.dim() > 0 else None,
        budget_s=budget_s,
    )
    try:
        clone = copy.deepcopy(model) if copy_model else model
    except Exception as exc:  # a model holding locks, open files, weakrefs...
        result.skipped = f"the model cannot be copied ({type(exc).__name__}: {exc})"
        return result
    if loss_fn is None:
        loss: Callable[[Any], torch.Tensor] = _default_loss
    elif target is not None:
        loss = lambda out: loss_fn(out, target)  # noqa: E731
    else:
        loss = loss_fn
    runner = _Runner(clone, args, named, loss, device, seed)
    names = precisions or _default_precisions(device)
    want_fp8 = "fp8" in names
    names = [n for n in names if n != "fp8"]
    if "fp32" not in names:
        names = ["fp32", *names]
    rows = {n: PrecisionResult(n) for n in names}
    result.results = list(rows.values())
    if "fp16" in droppable and "fp16" in names and not fp16_native(device):
        rows["fp16"].not_run = emulated_fp16(keep)
        names = [n for n in names if n != "fp16"]
    runner.fp16 = "fp16" in names
    observed_s = _observe_all(runner, names, rows)
    ok = [n for n in names if rows[n].error is None]
    if want_fp8:
        result.fp8 = _fp8_within_budget(
            runner, observed_s, ok, started, math.inf if fp8_required else budget_s, fp8_recipe
        )
    dropped = affordable(
        observed_s,
        {n for n in droppable if not native(n, device)},
        spent_s=time.perf_counter() - started,
        budget_s=budget_s,
        rounds=max(1, min(MIN_ROUNDS, min_samples)),
    )
    for name, why in dropped.items():
        rows[name].not_timed = why
    ok = [n for n in ok if n not in dropped]
    # the per-module forwards come after the rounds: the rounds leave them their share
    after_s = sum(observed_s[n] / OBSERVED_PASSES * MODULE_PASSES for n in ok)
    _time_all(runner, ok, rows, result, started, tolerance, min_samples, after_s)
    try:
        _module_costs(runner, ok, rows)
    except Exception as exc:  # the per-module split is evidence, never worth the comparison
        for name in ok:
            rows[name].modules = [{"error": f"{type(exc).__name__}: {exc}"}]
    _recommend(result, keep, () if bf16_native(device) else ("bf16",))
    result.spent_s = time.perf_counter() - started
    return result


def emulated_fp16(run: str) -> str:
    """Why FP16 was not run on a CPU that emulates it, for a run in ``run``, in a user's words.

    Such a CPU (no AVX512_FP16/AMX_FP16) converts every FP16 op to FP32 and back: FP16 is
    many times slower than FP32 there, so it can never be the recommendation, and its
    observed pass with the loss-scale search (several emulated backwards: on timm's ResNet
    350 ms of a 1.9 s exit) would only lengthen the exit. Its numerics are not measured
    either: the run is not in FP16, and no advice here would move it there.
    """
    name = precision_choice.NAMES.get(run, run)
    return (
        "not run: this CPU emulates FP16 (no AVX512_FP16 or AMX_FP16), many times slower "
        f"than FP32, so it is never the faster choice here; your run is in {name}"
    )


def _secs(seconds: float) -> str:
    """Seconds in words, never in scientific notation ("7.2 ms", "4.1 s")."""
    from ampdiag import units

    return units.micros(seconds * 1e6)


def _split_batch(
    batch: Any, kwargs: dict[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The forward's positional and keyword arguments: a dict is keywords, a tuple positions."""
    args, named = (
        ((), dict(batch)) if isinstance(batch, dict)
        else (tuple(batch), {}) if isinstance(batch, (tuple, list)) else ((batch,), {})
    )  # fmt: skip
    named.update(kwargs or {})
    return args, named


def _observe_all(
    runner: _Runner, names: list[str], rows: dict[str, PrecisionResult]
) -> dict[str, float]:
    """Numerics: one observed run of each precision (this also warms each up before timing).

    Fills each row's numerics against FP32's (the first), or its error; returns each observed
    pass's seconds, as a timed run repeats it (without the backwards of FP16's loss-scale
    backoff).
    """
    ref: tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int] | None = None
    observed_s: dict[str, float] = {}
    for name in names:
        try:
            t0 = time.perf_counter()
            observed = runner.run(name, observe=True)
            observed_s[name] = time.perf_counter() - t0 - runner.backoff_s
        except Exception as exc:
            rows[name].error = f"{type(exc).__name__}: {exc}"
            continue
        if name == "fp32":
            ref = observed
            runner.grad_peak = max((float(g.abs().max()) for g in observed[2] if g.numel()),
                                   default=0.0)  # fmt: skip
        _numerics(rows[name], observed, ref, [n for n, _ in runner.params])
        if name == "fp16":
            rows[name].loss_scale = runner.fp16_scale
    return observed_s


def _fp8_within_budget(
    runner: _Runner,
    observed_s: dict[str, float],
    ok: list[str],
    started: float,
    budget_s: float,
    recipe: str,
) -> dict[str, Any]:
    """FP8 readiness (`sources.live.fp8`), when its cost fits the budget beside the timing's.

    Its cost is predicted from FP32's observed pass (`fp8.FP8_PASSES` passes); the timing
    rounds every precision still gets (`MIN_ROUNDS` and the per-module forwards) are counted
    first, so FP8 never pushes the A/B past its budget: it is skipped, with the figures.
    """
    from ampdiag.compat import fp8 as cfp8
    from ampdiag.sources.live import fp8

    if not cfp8.available():
        return {"skipped": f"this torch ({torch.__version__}) has no FP8 dtypes"}
    if "fp32" not in observed_s:
        return {"skipped": "FP32 did not run: no reference"}
    per_pass = observed_s["fp32"] / OBSERVED_PASSES
    need = fp8.FP8_PASSES * per_pass
    timing_s = sum(observed_s[n] / OBSERVED_PASSES * (MIN_ROUNDS + MODULE_PASSES) for n in ok)
    spent = time.perf_counter() - started
    if spent + need + timing_s > budget_s:
        return {
            "skipped": (
                f"it needs about {_secs(need)} ({fp8.FP8_PASSES:g} FP32 passes), and with the "
                f"{_secs(spent)} spent and {_secs(timing_s)} for the timing rounds it would "
                f"overrun the A/B's budget of {_secs(budget_s)}"
            ),
            "estimated_s": need,
        }
    try:
        return fp8.readiness(
            runner.model,
            runner.args,
            runner.kwargs,
            runner.loss_fn,
            runner.device,
            runner.seed,
            recipe,
        )
    except Exception as exc:  # FP8 is evidence, never worth the comparison
        return {"error": f"{type(exc).__name__}: {exc}"}


def _numerics(
    row: PrecisionResult,
    observed: tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int],
    ref: tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int] | None,
    param_names: list[str],
) -> None:
    loss, outputs, grads, saved = observed
    row.loss, row.saved_bytes = loss, saved
    row.nonfinite = not math.isfinite(loss) or not all(_finite(g) for g in grads)
    if ref is None or row.precision == "fp32":
        return
    ref_loss, ref_outputs, ref_grads, _ = ref
    row.loss_rel_diff = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)
    out_sqnr = {n: sqnr_db(ref_outputs[n], o) for n, o in outputs.items() if n in ref_outputs
                and ref_outputs[n].shape == o.shape}  # fmt: skip
    if out_sqnr:
        row.worst_output_module = min(out_sqnr, key=lambda n: out_sqnr[n])
        row.output_sqnr_db_min = out_sqnr[row.worst_output_module]
        row.output_sqnr_db_median = statistics.median(out_sqnr.values())
    # counts, not masks: a bool mask per gradient and reduction was most of the numerics'
    # time on a ResNet's 4.9M gradient values (`bench_exit_parts --script timm`)
    ref_nonzero = [int(torch.count_nonzero(r)) for r in ref_grads]
    grad_sqnr = {n: sqnr_db(r, g) for n, r, g, z in zip(param_names, ref_grads, grads, ref_nonzero,
                                                         strict=True) if z}  # fmt: skip
    if grad_sqnr:
        row.worst_grad_param = min(grad_sqnr, key=lambda n: grad_sqnr[n])
        row.grad_sqnr_db_min = grad_sqnr[row.worst_grad_param]
        row.grad_sqnr_db_median = statistics.median(grad_sqnr.values())
    nonzero = sum(ref_nonzero)
    lost = sum(_lost(r, g) for r, g, z in zip(ref_grads, grads, ref_nonzero, strict=True) if z)
    row.grad_underflow = lost / nonzero if nonzero else 0.0


def _finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: its least and largest are (NaN propagates into both)."""
    if not t.numel():
        return True
    low, high = torch.aminmax(t)
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _lost(ref: torch.Tensor, other: torch.Tensor) -> int:
    """Values zero in ``other`` but not in ``ref`` (underflow); none to find without a zero."""
    if int(torch.count_nonzero(other)) == other.numel():
        return 0
    return int((ref.ne(0) & other.eq(0)).sum())


def affordable(
    observed_s: dict[str, float],
    droppable: Collection[str],
    *,
    spent_s: float,
    budget_s: float,
    rounds: int,
) -> dict[str, str]:
    """The droppable precisions whose timing would overrun the budget, each with why.

    Timing a precision costs ``rounds`` timed passes and its per-module forwards
    (`MODULE_PASSES`), each pass predicted from its observed run (`OBSERVED_PASSES` passes).
    Those that must be timed (FP32, the run's own, the speed probe's figures, and every
    precision the device runs natively, `native`) are timed whatever the budget, and so is a
    droppable (emulated) one whose observed run is under `OUT_OF_RACE` times the fastest of
    theirs: a contender, which its least version (one round, once out of the race) keeps
    cheap. One slower than that (an emulated BF16, many times slower) is kept, cheapest first,
    only while what was spent and all that is kept fit the budget; the A/B then overruns its
    budget by its observed run at most, never by its timed rounds. The observed run is cold
    (the first pass of its precision in the process), which is why a native precision never
    comes here: the corpus's CNN's native BF16 took 6 ms cold against 1.2 ms warm, over 2x
    FP32's, and went untimed in a first run in its process, so FP32 was recommended where
    BF16 ties it.
    """

    def cost(name: str) -> float:
        return observed_s[name] / OBSERVED_PASSES * (rounds + MODULE_PASSES)

    must = [n for n in observed_s if n not in droppable]
    fastest = min((observed_s[n] for n in must), default=0.0)
    need = spent_s + sum(cost(n) for n in must)
    dropped: dict[str, str] = {}
    for name in sorted((n for n in observed_s if n in droppable), key=cost):
        if observed_s[name] < OUT_OF_RACE * fastest or need + cost(name) <= budget_s:
            need += cost(name)
            continue
        dropped[name] = (
            f"not timed: its observed pass took {observed_s[name] * 1e3:.0f} ms (over "
            f"{OUT_OF_RACE:g}x the fastest of those always timed, {fastest * 1e3:.0f} ms), so "
            f"timing it ({rounds} "
            f"round{'s' if rounds > 1 else ''} and the per-module forwards, about "
            f"{_secs(cost(name))}) would overrun the A/B's budget of {_secs(budget_s)} "
            f"({_secs(spent_s)} spent, {_secs(max(0.0, need - spent_s))} for the others)"
        )
    return dropped


def _still_racing(racing: list[str], samples: dict[str, list[float]]) -> list[str]:
    """The precisions still worth timing: a clear loser leaves the rounds, keeping its samples.

    A precision whose first pass is at least `OUT_OF_RACE` times the fastest one's least pass
    (from the first round on) is far beyond the 1.10x a speed claim needs: timing it further
    only spends the exit (FP16 on a CPU without native FP16 is many times slower, and would
    take all of the budget). Its first pass, not its least: the decision is then the same
    whichever later pass load happened to slow.
    """
    best = min(min(samples[n]) for n in racing)
    return [n for n in racing if samples[n][0] < OUT_OF_RACE * best or min(samples[n]) == best]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's garbage collector paused for one timed pass, as `timeit` pauses it.

    A collection the pass's allocations set off is charged to that pass: after a thousand
    tests in one process, 20 ms and more, on passes of 1-2 ms. One on a precision's first
    timed pass put it out of the race (`_still_racing`: 2x the fastest's least) in a CI run.
    The collector's state is restored as found; a pending collection runs between passes.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _on_the_bar(samples: dict[str, list[float]], racing: list[str]) -> bool:
    """Whether a speed claim between two precisions still racing rests on the bar.

    The lower end of one's speed-up over the other (`precision_choice.clears`: the other's
    least pass over this one's second least) within `NEAR_BAR` of `SWITCH_SPEEDUP`, either
    side. There, a pass that load slowed decides the choice: more rounds give each precision's
    least more chances to be undisturbed, and the lower end moves toward the true ratio, away
    from the bar, so that identical runs choose alike.
    """
    bar = precision_choice.SWITCH_SPEEDUP
    least = {n: timing.least(samples[n]) for n in racing if len(samples[n]) >= timing.MIN_SAMPLES}
    return any(
        bar / NEAR_BAR <= timing.quotient(least[b], least[a]).low < bar * NEAR_BAR
        for a in least
        for b in least
        if a != b
    )


def _time_all(
    runner: _Runner,
    names: list[str],
    rows: dict[str, PrecisionResult],
    result: PrecisionComparison,
    started: float,
    tolerance: float,
    min_samples: int,
    after_s: float = 0.0,
) -> None:
    """Interleaved timed rounds until every least time is tight, or the budget would be overrun.

    A round starts only while it fits the budget with ``after_s`` (the per-module forwards
    still to come) beside it, predicted from the last round's wall times; the least version's
    rounds run whatever the budget, and so do rounds up to `MAX_ROUNDS` while a speed claim
    rests on the bar (`_on_the_bar`) and a round is cheap (`BAR_ROUND_S`). A pass on a CPU is
    timed in process CPU time (`CLOCK`).
    """
    samples: dict[str, list[float]] = {n: [] for n in names}
    walls: dict[str, float] = {}
    peaks: dict[str, int] = {}
    cuda = runner.device.type == "cuda"
    clock = time.perf_counter if cuda else CLOCK
    rounds = 0
    racing = list(names)
    while racing:
        order = racing[rounds % len(racing) :] + racing[: rounds % len(racing)]
        for name in order:
            if cuda:
                torch.cuda.reset_peak_memory_stats(runner.device)
                base = torch.cuda.memory_allocated(runner.device)
            with gc_paused():
                t0, c0 = time.perf_counter(), clock()
                runner.run(name, observe=False)
                samples[name].append(clock() - c0)
                walls[name] = time.perf_counter() - t0
            if cuda:
                peak = torch.cuda.max_memory_allocated(runner.device) - base
                peaks[name] = max(peaks.get(name, 0), peak)
        rounds += 1
        # a clear loser leaves, unless the rounds end here anyway (then it is no one-round row)
        left = _still_racing(racing, samples)
        # the two least passes within ``tolerance`` of each other (half the gap, the least's
        # spread, within half of it): two passes a busy spell slowed alike agree less often
        tight = all(timing.tight(timing.least(samples[n]), tolerance / 2) for n in left)
        # every precision still racing gets MIN_ROUNDS samples unless fewer were asked for
        need = time.perf_counter() - started + sum(walls[n] for n in left) + after_s
        done = (rounds >= min_samples and tight) or (
            need > result.budget_s and rounds >= min(MIN_ROUNDS, min_samples)
        )
        # the least passes on the A/B's clock: whether to go on must not move with the load
        cheap = need <= result.budget_s or sum(min(samples[n]) for n in left) < BAR_ROUND_S
        if done and not (min_samples >= MIN_ROUNDS and rounds < MAX_ROUNDS and cheap
                         and _on_the_bar(samples, left)):  # fmt: skip
            break
        racing = left
    times = {n: [round(x * 1000, 4) for x in s] for n, s in samples.items()}
    fastest = min(min(s) for s in samples.values() if s)
    estimates: dict[str, timing.Estimate] = {}
    for name, ms in times.items():
        row = rows[name]
        if name not in racing and len(ms) == 1 and fastest > 0:
            row.one_round = round(samples[name][0] / fastest, 3)
        # the figures of the rows' times, as every reader of the row takes them
        est = precision_choice.estimate({"times_ms": ms, "one_round": row.one_round})
        estimates[name] = est = est or timing.least(ms)
        row.samples = len(ms)
        row.times_ms = ms
        row.time_ms = est.median
        row.time_spread_ms = est.spread if est.samples >= timing.MIN_SAMPLES else None
        row.peak_bytes = peaks.get(name)
    ref = estimates.get("fp32")
    if ref is None:
        return
    for name, est in estimates.items():
        if name == "fp32":
            continue
        # FP32's time over this one's, with the interval the two intervals allow: faster or
        # slower only when the whole interval is beyond 1; None: within the noise, or a single
        # sample each (no interval, so no claim)
        ratio = timing.quotient(ref, est)
        rows[name].speedup = ratio.median
        rows[name].faster = {"above": True, "below": False, "uncertain": None}[ratio.versus(1.0)]


def _module_costs(runner: _Runner, names: list[str], rows: dict[str, PrecisionResult]) -> None:
    """Each slower low precision's leaf modules against FP32: forward time, casts, kernels, cause.

    Two forwards per low precision, one in FP32 (untimed as a whole, after the timing rounds):
    one timing the modules, one the casts (`_Runner.module_times`). ``cause`` is ``"casts"``
    when the casts take at least half of the extra time, else ``"kernels"``: the low-precision
    kernels themselves are slower than FP32's (on a CPU without native FP16, a convolution's
    FP16 kernel is, by far). A precision measured faster (``faster``) has no loss to explain
    (`autocast-slower`'s cause): its forwards are not run.
    """
    names = [n for n in names if n == "fp32" or rows[n].faster is not True]
    if "fp32" not in names or len(names) < 2:
        return
    base = runner.module_times("fp32", casts=False)
    for name in names:
        if name in ("fp32", "tf32"):
            continue
        own = runner.module_times(name, casts=False)
        casts = runner.module_times(name, casts=True)
        modules = []
        for module, ms in own.items():
            ref = base.get(module)
            if ref is None:
                continue
            cast_ms = min(casts.get(module, 0.0), ms)
            extra = ms - ref
            entry: dict[str, Any] = {
                "module": module,
                "fp32_ms": round(ref, 4),
                "ms": round(ms, 4),
                "cast_ms": round(cast_ms, 4),
                "kernel_ms": round(ms - cast_ms, 4),
            }
            if extra > 0:
                entry["cause"] = "casts" if cast_ms >= extra / 2 else "kernels"
            modules.append(entry)
        modules.sort(key=lambda m: m["fp32_ms"] - m["ms"])
        rows[name].modules = modules[:TOP_MODULES]


def _recommend(
    result: PrecisionComparison, keep: str = "fp32", emulated: Collection[str] = ()
) -> None:
    """The precision `precision_choice.choose` picks (``keep`` unless one is clearly faster)."""
    ref = next((r for r in result.results if r.precision == "fp32"), None)
    for row in result.results:
        data = asdict(row)
        row.safe = precision_choice.is_safe(data)
        row.unsafe_reasons = precision_choice.unsafe_reasons(data)
        if ref is None or row is ref:
            continue
        base = asdict(ref)
        ratio = precision_choice.speedup(base, data)
        if ratio is not None:
            row.speedup_low, row.speedup_high = ratio.get("low"), ratio.get("high")
        row.activation_saving = precision_choice.saving(base, data, "saved_bytes")
        row.peak_saving = precision_choice.saving(base, data, "peak_bytes")
    choice = precision_choice.choose([asdict(r) for r in result.results], keep, emulated)
    if choice is None:
        result.recommended = "fp32" if ref is not None and ref.error is None else None
        result.reason = "nothing was timed" if result.recommended else "FP32 failed to run"
        return
    result.recommended, result.tied, result.uncertain = (
        choice.precision,
        choice.tied,
        choice.uncertain,
    )
    best = result.result(choice.precision)
    names = precision_choice.NAMES
    parts = []
    held = result.result(keep) if any(r.precision == keep for r in result.results) else ref
    if best is not held and held is not None and held.time_ms and best.time_ms:
        ratio = precision_choice.speedup(asdict(held), asdict(best)) or {}
        spread = (
            f" (between {ratio['low']:.2f}x and {ratio['high']:.2f}x)" if "low" in ratio else ""
        )
        parts.append(
            f"{names.get(best.precision, best.precision)} is {held.time_ms / best.time_ms:.2f}x "
            f"as fast as {names.get(held.precision, held.precision)}{spread}"
        )
        if best.activation_saving is not None and best.precision != "fp32":
            parts.append(f"saves {best.activation_saving:.0%} of the activation memory")
    if not choice.timed:
        parts.append("each precision was timed once: no spread, so no speed claim")
    elif best is held or choice.uncertain:
        others = [names.get(p, p) for p in choice.tied if p != choice.precision]
        if others:
            parts.append(
                f"{', '.join(others)} not measured clearly faster or slower "
                f"({precision_choice.tie_break(choice, keep)})"
            )
        elif best is held:
            parts.append(precision_choice.tie_break(choice, keep))
    if choice.unsafe:
        parts.append(
            "not numerically safe: "
            + "; ".join(f"{names.get(p, p)} ({', '.join(why)})" for p, why in choice.unsafe.items())
        )
    parts += [f"{names.get(r.precision, r.precision)} {r.not_timed or r.not_run}"
              for r in result.results if r.not_timed or r.not_run]  # fmt: skip
    parts += [f"{names.get(r.precision, r.precision)} timed in one round (its pass "
              f"{r.one_round:.1f}x the fastest's least)" for r in result.results
              if r.one_round]  # fmt: skip
    result.reason = "; ".join(parts)
