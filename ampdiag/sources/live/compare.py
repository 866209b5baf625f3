"""``ampdiag.compare``: which precision for this model on this device, measured on its own batch.

For every precision the device runs — FP32, BF16 autocast, FP16 autocast with a loss scale as a
GradScaler applies it (and TF32 matmuls on CUDA) — it measures one forward + backward of the
user's model on the user's batch:

- **time**: interleaved rounds (every precision once per round, the order rotated), repeated
  until each precision's median is known to within ``tolerance`` (the half-width of the
  interquartile range over the median) or the time budget is spent; the median and that
  spread are reported, and a speed-up is called only when the intervals do not overlap;
- **memory**: on CUDA the peak allocated above the start; everywhere, the bytes autograd saves
  for backward (activation memory: what autocast can shrink), counted with
  ``torch.autograd.graph.saved_tensors_hooks``;
- **error against FP32**: the loss difference, and the signal-to-quantization-noise ratio (SQNR,
  dB) of every leaf module's output and of every parameter's gradient — the worst and the
  median; and the **underflow** each would have: gradient values that are zero in that
  precision but not in FP32.

Observe, never change: all of it runs on a deep copy of the model (parameters, buffers and any
Python state the forward touches stay the user's), with the random number generators forked
and seeded alike for every precision, so dropout draws the same masks in each and nothing the
training would see. Global modes it sets (TF32) are restored.
"""

from __future__ import annotations

import contextlib
import copy
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ampdiag.sources.live.collectors.base import tensors_in

#: The loss scale of the FP16 measurement (a GradScaler's default ``init_scale``).
FP16_LOSS_SCALE = 2.0**16
#: A precision is numerically safe when its loss differs from FP32's by at most this share,
#: at most this share of FP32's nonzero gradient values underflow to zero, and nothing is
#: inf/NaN.
SAFE_LOSS_REL_DIFF = 0.01
SAFE_UNDERFLOW = 0.01
DEFAULT_BUDGET_S = 20.0
#: The SQNR of identical tensors (no noise), and its negative for non-finite noise: finite, so
#: that a session's JSON round-trips, and beyond what float64 arithmetic can resolve (~313 dB).
EXACT_SQNR_DB = 400.0


@dataclass
class PrecisionResult:
    """One precision's measurements (times in ms, memory in bytes, SQNR in dB)."""

    precision: str
    time_ms: float | None = None
    time_spread_ms: float | None = None
    samples: int = 0
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
    speedup: float | None = None
    faster: bool | None = None
    safe: bool | None = None
    error: str | None = None


@dataclass
class PrecisionComparison:
    """What `compare` measured, and the precision it recommends."""

    device: str
    batch_size: int | None
    results: list[PrecisionResult] = field(default_factory=list)
    recommended: str | None = None
    reason: str = ""
    budget_s: float = DEFAULT_BUDGET_S
    spent_s: float = 0.0
    skipped: str | None = None

    def result(self, precision: str) -> PrecisionResult:
        """One precision's row."""
        for r in self.results:
            if r.precision == precision:
                return r
        raise KeyError(precision)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the session's ``precision_ab`` section)."""
        return asdict(self)


def supported_precisions(device: torch.device) -> list[str]:
    """FP32 and the low precisions this device runs (TF32 on CUDA GPUs that have it)."""
    out = ["fp32"]
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major >= 8:
            out.append("tf32")
        if torch.cuda.is_bf16_supported():
            out.append("bf16")
        out.append("fp16")
    else:
        out += ["bf16", "fp16"]
    return out


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
def class_forward(model: torch.nn.Module) -> Iterator[None]:
    """Runs the class's forward where the instance's was replaced (a wrapped forward).

    Accelerate sets ``model.forward`` to the forward wrapped in autocast: through it the FP32
    pass would run under autocast too. The instance attribute is put back on exit.
    """
    wrapped = vars(model).get("forward")
    if wrapped is None:
        yield
        return
    del model.forward
    try:
        yield
    finally:
        model.forward = wrapped


def _leaves(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if not any(m.children()) and n]


def _sqnr_db(ref: torch.Tensor, other: torch.Tensor) -> float:
    ref, other = ref.detach().double(), other.detach().double()
    noise = float((ref - other).pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return EXACT_SQNR_DB
    if not math.isfinite(noise) or signal == 0.0:
        return -EXACT_SQNR_DB
    return max(-EXACT_SQNR_DB, min(EXACT_SQNR_DB, 10.0 * math.log10(signal / noise)))


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
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(self.seed)
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
                scale = FP16_LOSS_SCALE if precision == "fp16" else 1.0
                grads = torch.autograd.grad(
                    loss * scale, [p for _, p in self.params], allow_unused=True
                )
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
            `supported_precisions`).
        budget_s: Wall time the timing rounds may spend, in all.
        tolerance: Stop timing once every median is known to within this share.
        min_samples: Timed samples of each precision at least (budget permitting).
        seed: The random seed every precision's forward starts from (dropout masks alike).
        kwargs: Keyword arguments of the model's forward, beside ``batch``.
        copy_model: Measure a deep copy (the default). ``False`` measures ``model`` itself:
            only for a model that is already a throwaway copy (the speed probe's).

    Returns:
        A `PrecisionComparison`: one row per precision, and the recommended one — the fastest
        whose numerics are safe (see ``SAFE_*``), with the reason.
    """
    started = time.perf_counter()
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    args, named = (
        ((), dict(batch)) if isinstance(batch, dict)
        else (tuple(batch), {}) if isinstance(batch, (tuple, list)) else ((batch,), {})
    )  # fmt: skip
    named.update(kwargs or {})
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
    names = precisions or supported_precisions(device)
    if "fp32" not in names:
        names = ["fp32", *names]
    rows = {n: PrecisionResult(n) for n in names}
    result.results = list(rows.values())
    # Numerics: one observed run each (this also warms every precision up before timing).
    ref: tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int] | None = None
    for name in names:
        try:
            observed = runner.run(name, observe=True)
        except Exception as exc:
            rows[name].error = f"{type(exc).__name__}: {exc}"
            continue
        if name == "fp32":
            ref = observed
        _numerics(rows[name], observed, ref, [n for n, _ in runner.params])
    _time_all(runner, [n for n in names if rows[n].error is None], rows, result, started,
              tolerance, min_samples)  # fmt: skip
    _recommend(result)
    result.spent_s = time.perf_counter() - started
    return result


def _numerics(
    row: PrecisionResult,
    observed: tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int],
    ref: tuple[float, dict[str, torch.Tensor], list[torch.Tensor], int] | None,
    param_names: list[str],
) -> None:
    loss, outputs, grads, saved = observed
    row.loss, row.saved_bytes = loss, saved
    row.nonfinite = not math.isfinite(loss) or any(not bool(g.isfinite().all()) for g in grads)
    if ref is None or row.precision == "fp32":
        return
    ref_loss, ref_outputs, ref_grads, _ = ref
    row.loss_rel_diff = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)
    out_sqnr = {n: _sqnr_db(ref_outputs[n], o) for n, o in outputs.items() if n in ref_outputs
                and ref_outputs[n].shape == o.shape}  # fmt: skip
    if out_sqnr:
        row.worst_output_module = min(out_sqnr, key=lambda n: out_sqnr[n])
        row.output_sqnr_db_min = out_sqnr[row.worst_output_module]
        row.output_sqnr_db_median = statistics.median(out_sqnr.values())
    grad_sqnr = {n: _sqnr_db(r, g) for n, r, g in zip(param_names, ref_grads, grads, strict=True)
                 if bool(r.ne(0).any())}  # fmt: skip
    if grad_sqnr:
        row.worst_grad_param = min(grad_sqnr, key=lambda n: grad_sqnr[n])
        row.grad_sqnr_db_min = grad_sqnr[row.worst_grad_param]
        row.grad_sqnr_db_median = statistics.median(grad_sqnr.values())
    nonzero = sum(int(r.ne(0).sum()) for r in ref_grads)
    lost = sum(int((r.ne(0) & g.eq(0)).sum()) for r, g in zip(ref_grads, grads, strict=True))
    row.grad_underflow = lost / nonzero if nonzero else 0.0


def _spread(samples: list[float]) -> float:
    """Half the interquartile range: the median's uncertainty, robust to a stalled sample."""
    if len(samples) < 2:
        return math.inf
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


def _time_all(
    runner: _Runner,
    names: list[str],
    rows: dict[str, PrecisionResult],
    result: PrecisionComparison,
    started: float,
    tolerance: float,
    min_samples: int,
) -> None:
    samples: dict[str, list[float]] = {n: [] for n in names}
    peaks: dict[str, int] = {}
    cuda = runner.device.type == "cuda"
    rounds = 0
    while names:
        order = names[rounds % len(names) :] + names[: rounds % len(names)]
        for name in order:
            if cuda:
                torch.cuda.reset_peak_memory_stats(runner.device)
                base = torch.cuda.memory_allocated(runner.device)
            t0 = time.perf_counter()
            runner.run(name, observe=False)
            samples[name].append(time.perf_counter() - t0)
            if cuda:
                peak = torch.cuda.max_memory_allocated(runner.device) - base
                peaks[name] = max(peaks.get(name, 0), peak)
        rounds += 1
        spent = time.perf_counter() - started
        tight = all(_spread(s) <= tolerance * statistics.median(s) for s in samples.values())
        if rounds >= min_samples and (tight or spent >= result.budget_s):
            break
        if spent >= result.budget_s and rounds >= 1:
            break
    for name, s in samples.items():
        row = rows[name]
        row.samples = len(s)
        row.time_ms = statistics.median(s) * 1000
        row.time_spread_ms = _spread(s) * 1000 if len(s) > 1 else None
        row.peak_bytes = peaks.get(name)
    ref = rows.get("fp32")
    if ref is None or ref.time_ms is None:
        return
    for row in rows.values():
        if row.precision == "fp32" or row.time_ms is None:
            continue
        row.speedup = ref.time_ms / row.time_ms
        lo_ref = ref.time_ms - (ref.time_spread_ms or 0.0)
        hi_row = row.time_ms + (row.time_spread_ms or 0.0)
        hi_ref = ref.time_ms + (ref.time_spread_ms or 0.0)
        lo_row = row.time_ms - (row.time_spread_ms or 0.0)
        # faster / slower only when the intervals do not overlap; None: within the noise
        if ref.time_spread_ms is None or row.time_spread_ms is None:
            continue  # one sample each: no interval, so no claim
        row.faster = True if hi_row < lo_ref else (False if lo_row > hi_ref else None)


def _recommend(result: PrecisionComparison) -> None:
    """The fastest precision whose numerics are safe; FP32 when none is both safe and faster."""
    for row in result.results:
        if row.error is not None:
            continue
        row.safe = not row.nonfinite and (
            row.precision == "fp32"
            or (
                (row.loss_rel_diff or 0.0) <= SAFE_LOSS_REL_DIFF
                and (row.grad_underflow or 0.0) <= SAFE_UNDERFLOW
            )
        )
    candidates = [r for r in result.results if r.safe and r.faster]
    if candidates:
        best = min(candidates, key=lambda r: r.time_ms or math.inf)
        result.recommended = best.precision
        result.reason = (
            f"{best.precision} is {best.speedup:.2f}x as fast as FP32 here "
            f"({best.time_ms:.3g} vs {result.result('fp32').time_ms:.3g} ms per forward + "
            "backward) and numerically safe (loss within "
            f"{(best.loss_rel_diff or 0.0):.2%} of FP32, {(best.grad_underflow or 0.0):.2%} "
            "of gradient values lost)"
        )
        return
    result.recommended = "fp32"
    unsafe = [r.precision for r in result.results if r.safe is False]
    slow = [r.precision for r in result.results if r.safe and r.precision != "fp32"]
    parts = []
    if slow:
        parts.append(f"{', '.join(slow)} measured no faster than FP32 (within the noise or slower)")
    if unsafe:
        parts.append(f"{', '.join(unsafe)} not numerically safe")
    result.reason = "; ".join(parts) or "only FP32 was measured"
