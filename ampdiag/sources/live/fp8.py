"""FP8 readiness: which ``nn.Linear`` layers of this model can train in FP8, on its own batch.

FP8 training (torchao's ``convert_to_float8_training``, Transformer Engine's ``te.Linear``)
runs the three matmuls of every converted Linear -- the output ``x @ W^T``, the input gradient
``dY @ W`` and the weight gradient ``dY^T @ x`` -- on FP8 operands, each scaled so that its
amax lands on the format's largest value. Whether a layer survives that is decided by its own
tensors: an outlier channel (one feature 10^4 times the rest, as LLM activations carry) sets
a per-tensor amax that pushes every other value below the format's smallest normal, where it
keeps fewer mantissa bits or flushes to zero. So the layers are measured one by one: the
FP32 pass captures each Linear's input and output gradient, and the layer's three matmuls are
redone in FP8 from exactly those, with the recipe's arithmetic, and held against FP32
(SQNR), with the share of values that land below the smallest normal, flush to zero or
saturate at the chosen scale. A layer is FP8-safe when all of them pass `THRESHOLDS`.

The recipes are those users choose from, with torchao's and Transformer Engine's arithmetic:

- ``tensorwise`` (torchao's default, TE's current scaling): one scale per tensor from its
  current amax, ``scale = max_fp8 / max(amax, 1e-12)`` in float64 then float32; E4M3 for
  the input and weight, E5M2 for the output gradient;
- ``rowwise`` (torchao's ``rowwise``): one scale per row of each operand along the matmul's
  reduction dimension, rounded down to a power of two, E4M3 for all three;
- ``delayed`` (TE's ``DelayedScaling``, HYBRID format): the scale from the largest amax of a
  history of earlier steps, so a value beyond that saturates; E4M3 forward, E5M2 backward.
  On one batch the history holds this batch's amax (the A/B has no earlier step).

The matmuls themselves are `compat.fp8.scaled_mm` (``torch._scaled_mm``, FP32 accumulation),
the op FP8 training runs. Then the layers found safe are converted together, the rest left in
BF16 autocast, and that model's loss is held against BF16's on the batch. On a GPU with FP8
(compute capability >= 8.9) the converted layers' forward is timed against BF16's.

Observe, never change: it runs on the A/B's copy of the model; hooks and replaced forwards
are removed on exit.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ampdiag.analysis.fp8 import module_filter
from ampdiag.compat import fp8 as cfp8
from ampdiag.sources.live.passes import class_forward, sqnr_db


#: What a layer must pass to be FP8-safe (each documented in the README).
@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # SQNR (dB) against FP32 of the layer's output, input gradient and weight gradient, each
    # computed in FP8 from the FP32 pass's own input and output gradient. E4M3 rounding alone
    # gives about 31 dB, E5M2 about 25 dB: 20 dB leaves room for the matmul's accumulation.
    sqnr_db_min: float = 20.0
    # Share of an operand's nonzero values (input, weight, output gradient) that land below the
    # format's smallest normal at the chosen scale (fewer mantissa bits, or flushed to zero).
    low_share_max: float = 0.10
    # Share of an operand's values beyond the format's largest at the chosen scale (clamped).
    saturated_share_max: float = 0.001


THRESHOLDS = Thresholds()
#: torchao's and cuBLAS's FP8 kernels need both dimensions of a Linear to be multiples of 16.
KERNEL_MULTIPLE = 16
#: torchao's ``EPS`` in ``amax_to_scale``: the smallest amax a scale is computed from.
EPS = 1e-12
DEFAULT_RECIPE = "tensorwise"
#: Passes of forward + backward the FP8 measurement costs, in units of FP32's observed pass:
#: the capturing pass, the layers' FP8 matmuls (about a pass each way) and two forwards.
FP8_PASSES = 4.0
#: Timed repeats of each converted layer's forward on an FP8 GPU.
SPEED_REPEATS = 10


@dataclass(frozen=True)
class Recipe:
    """One scaling recipe: the formats and how the scales are chosen."""

    name: str
    forward: str  # "e4m3" for the input and weight
    grad: str  # the output gradient's format
    axiswise: bool
    pow2: bool


RECIPES = {
    "tensorwise": Recipe("tensorwise", "e4m3", "e5m2", axiswise=False, pow2=False),
    "rowwise": Recipe("rowwise", "e4m3", "e4m3", axiswise=True, pow2=True),
    "delayed": Recipe("delayed", "e4m3", "e5m2", axiswise=False, pow2=False),
}


def _dtype(name: str) -> torch.dtype:
    dtype = cfp8.E4M3 if name == "e4m3" else cfp8.E5M2
    if dtype is None:
        raise RuntimeError("this torch has no FP8 dtypes")
    return dtype


def to_scale(amax: torch.Tensor, dtype: torch.dtype, pow2: bool = False) -> torch.Tensor:
    """The scale of an amax, as torchao's ``amax_to_scale``: ``max_fp8 / max(amax, EPS)``."""
    scale = (torch.finfo(dtype).max / torch.clamp(amax.double(), min=EPS)).float()
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def quantize(
    x: torch.Tensor,
    dtype: torch.dtype,
    *,
    dim: int | None = None,
    pow2: bool = False,
    amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``x`` in FP8 (saturated), its dequantization scale, and what the cast lost.

    ``dim``: one scale per slice along that dimension (axiswise, keepdim) instead of one for
    the tensor; ``amax``: a given amax (delayed scaling) instead of the tensor's own.
    """
    x32 = x.float()
    if amax is None:
        amax = x32.abs().amax() if dim is None else x32.abs().amax(dim=dim, keepdim=True)
    scale = to_scale(amax, dtype, pow2)
    scaled = x32 * scale
    top = torch.finfo(dtype).max
    q = scaled.clamp(-top, top).to(dtype)
    nonzero = x32 != 0
    count = max(1, int(nonzero.sum()))
    magnitude = scaled.abs()
    stats = {
        "amax": float(x32.abs().amax()),
        "low_share": int((nonzero & (magnitude < torch.finfo(dtype).smallest_normal)).sum())
        / count,
        "flushed_share": int((nonzero & (q.float() == 0)).sum()) / count,
        "saturated_share": int((magnitude > top).sum()) / max(1, x32.numel()),
    }
    return q, scale.reciprocal(), stats


def fp8_matmuls(
    x: torch.Tensor,
    w: torch.Tensor,
    go: torch.Tensor,
    recipe: Recipe,
    amax: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, dict[str, float]]]:
    """A Linear's three matmuls in FP8: output, input and weight gradient (FP32), and losses.

    ``x`` is ``(m, k)``, ``w`` ``(n, k)``, ``go`` ``(m, n)``. Axiswise, each operand is scaled
    along the matmul's reduction dimension, as torchao's rowwise recipe does (``x`` per row
    for the output and per column for the weight gradient, and so on). ``amax``: the delayed
    recipe's amax for ``input``, ``weight`` and ``grad_output``.
    """
    f, g = _dtype(recipe.forward), _dtype(recipe.grad)
    given = amax or {}
    if recipe.axiswise:
        qx, sx, st_x = quantize(x, f, dim=-1, pow2=True)
        qw, sw, st_w = quantize(w, f, dim=-1, pow2=True)
        out = cfp8.scaled_mm(qx, qw.t(), sx, sw.t())
        qg, sg, st_g = quantize(go, g, dim=-1, pow2=True)
        qw0, sw0, _ = quantize(w, f, dim=0, pow2=True)
        grad_input = cfp8.scaled_mm(qg, qw0, sg, sw0)
        qg0, sg0, _ = quantize(go, g, dim=0, pow2=True)
        qx0, sx0, _ = quantize(x, f, dim=0, pow2=True)
        grad_weight = cfp8.scaled_mm(qg0.t(), qx0, sg0.t(), sx0)
    else:
        qx, sx, st_x = quantize(x, f, amax=given.get("input"))
        qw, sw, st_w = quantize(w, f, amax=given.get("weight"))
        qg, sg, st_g = quantize(go, g, amax=given.get("grad_output"))
        out = cfp8.scaled_mm(qx, qw.t(), sx, sw)
        grad_input = cfp8.scaled_mm(qg, qw, sg, sw)
        grad_weight = cfp8.scaled_mm(qg.t(), qx, sg, sx)
    return out, grad_input, grad_weight, {"input": st_x, "weight": st_w, "grad_output": st_g}


def _linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n]


@contextmanager
def _capture(
    model: torch.nn.Module,
) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Each Linear's first input and the gradient of its first output, while active."""
    inputs: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in _linears(model):

        def hook(_m: Any, args: Any, out: Any, name: str = name) -> None:
            if name in inputs or not args or not isinstance(args[0], torch.Tensor):
                return
            inputs[name] = args[0].detach().float().clone()
            if isinstance(out, torch.Tensor) and out.requires_grad:

                def grad_hook(g: torch.Tensor, name: str = name) -> None:
                    grads.setdefault(name, g.detach().float().clone())

                out.register_hook(grad_hook)  # type: ignore[no-untyped-call]

        handles.append(module.register_forward_hook(hook))
    try:
        yield inputs, grads
    finally:
        for h in handles:
            h.remove()


def _verdict(layer: dict[str, Any], recipe: Recipe) -> list[str]:
    """Why a layer should stay in BF16 (empty: FP8-safe), each reason with its numbers."""
    reasons = []
    low, sat = THRESHOLDS.low_share_max, THRESHOLDS.saturated_share_max
    fmt = {"input": recipe.forward, "weight": recipe.forward, "grad_output": recipe.grad}
    for operand in ("input", "weight", "grad_output"):
        st = layer[operand]
        if st["low_share"] > low:
            reasons.append(
                f"{st['low_share']:.0%} of its {operand.replace('_', ' ')} values fall below "
                f"{fmt[operand].upper()}'s smallest normal at the {recipe.name} scale (amax "
                f"{st['amax']:.3g}, {st['flushed_share']:.0%} flushed to zero; limit {low:.0%}):"
                " an outlier sets the scale for the rest"
            )
        if st["saturated_share"] > sat:
            reasons.append(
                f"{st['saturated_share']:.2%} of its {operand.replace('_', ' ')} values "
                f"saturate at the {recipe.name} scale (limit {sat:.1%})"
            )
    for key, what in (
        ("output_sqnr_db", "output"),
        ("grad_input_sqnr_db", "input gradient"),
        ("grad_weight_sqnr_db", "weight gradient"),
    ):
        value = layer[key]
        if value is not None and value < THRESHOLDS.sqnr_db_min:
            reasons.append(
                f"its {what}'s SQNR against FP32 is {value:.1f} dB "
                f"(limit {THRESHOLDS.sqnr_db_min:.0f} dB)"
            )
    bad = [d for d in (layer["in_features"], layer["out_features"]) if d % KERNEL_MULTIPLE]
    if bad:
        reasons.append(
            f"its shape {layer['out_features']}x{layer['in_features']} is not a multiple of "
            f"{KERNEL_MULTIPLE}: the FP8 kernels need one (torchao's default filter skips it)"
        )
    return reasons


@contextmanager
def _converted(
    layers: list[tuple[str, torch.nn.Linear]], recipe: Recipe, out_dtype: torch.dtype
) -> Iterator[None]:
    """Those layers' forward in FP8 (the recipe's input and weight casts, ``_scaled_mm``)."""
    f = _dtype(recipe.forward)

    def forward_of(module: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            x2 = x.reshape(-1, x.shape[-1])
            dim = -1 if recipe.axiswise else None
            qx, sx, _ = quantize(x2, f, dim=dim, pow2=recipe.pow2)
            qw, sw, _ = quantize(module.weight, f, dim=dim, pow2=recipe.pow2)
            out = cfp8.scaled_mm(qx, qw.t(), sx, sw.t() if recipe.axiswise else sw)
            if module.bias is not None:
                out = out + module.bias.float()
            return out.to(out_dtype).reshape(*x.shape[:-1], out.shape[-1])

        return forward

    try:
        for _, module in layers:
            module.forward = forward_of(module)  # type: ignore[method-assign,assignment]
        yield
    finally:
        for _, module in layers:
            vars(module).pop("forward", None)


def _speedup(
    layers: list[tuple[str, torch.nn.Linear]],
    shapes: dict[str, tuple[int, int]],
    recipe: Recipe,
    device: torch.device,
) -> float | None:
    """On an FP8 GPU, BF16's forward time of the converted layers over FP8's (medians)."""
    if not layers:
        return None
    f = _dtype(recipe.forward)

    def timed(fn: Callable[[], Any]) -> float:
        fn()
        torch.cuda.synchronize(device)
        samples = []
        for _ in range(SPEED_REPEATS):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    bf16 = fp8 = 0.0
    for name, module in layers:
        m, k = shapes[name]
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = module.weight.detach().to(torch.bfloat16)

        def bf16_forward(x: torch.Tensor = x, w: torch.Tensor = w) -> torch.Tensor:
            return torch.nn.functional.linear(x, w)

        bf16 += timed(bf16_forward)

        def fp8_forward(x: torch.Tensor = x, w: torch.Tensor = w) -> torch.Tensor:
            qx, sx, _ = quantize(x, f)
            qw, sw, _ = quantize(w, f)
            return cfp8.scaled_mm(qx, qw.t(), sx, sw, out_dtype=torch.bfloat16)

        fp8 += timed(fp8_forward)
    return bf16 / fp8 if fp8 > 0 else None


def readiness(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor],
    device: torch.device,
    seed: int,
    recipe: str = DEFAULT_RECIPE,
) -> dict[str, Any]:
    """Every Linear's FP8 numerics on this batch, the verdicts, and the recommendation.

    ``model`` is the A/B's copy (trained in FP32 here: each layer's FP32 input and output
    gradient are the reference its FP8 matmuls are held against).
    """
    started = time.perf_counter()
    chosen = RECIPES[recipe]
    params = [p for p in model.parameters() if p.requires_grad]
    forked = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), _capture(model) as (inputs, grads):
        torch.manual_seed(seed)
        with class_forward(model):
            loss = loss_fn(model(*args, **kwargs)).float()
        if params:
            torch.autograd.grad(loss, params, allow_unused=True)
    layers: list[dict[str, Any]] = []
    shapes: dict[str, tuple[int, int]] = {}
    linears = dict(_linears(model))
    with torch.no_grad():
        for name, module in linears.items():
            if name not in inputs or name not in grads:
                continue
            w = module.weight.detach().float()
            x = inputs[name].reshape(-1, w.shape[1])
            go = grads[name].reshape(-1, w.shape[0])
            shapes[name] = (x.shape[0], x.shape[1])
            # the delayed recipe's history: this batch's amax (the A/B has no earlier step)
            out, gi, gw, stats = fp8_matmuls(x, w, go, chosen)
            layer: dict[str, Any] = {
                "name": name,
                "in_features": int(w.shape[1]),
                "out_features": int(w.shape[0]),
                "output_sqnr_db": sqnr_db(x @ w.t(), out),
                "grad_input_sqnr_db": sqnr_db(go @ w, gi),
                "grad_weight_sqnr_db": sqnr_db(go.t() @ x, gw),
                **stats,
                "amax_drift": None,
            }
            layer["reasons"] = _verdict(layer, chosen)
            layer["verdict"] = "keep-bf16" if layer["reasons"] else "fp8-safe"
            layers.append(layer)
    convert = [la["name"] for la in layers if la["verdict"] == "fp8-safe"]
    keep = [la["name"] for la in layers if la["verdict"] != "fp8-safe"]
    low = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else None
    losses: dict[str, float | None] = {"bf16": None, "fp8": None}
    if low is not None:
        for key in losses:
            chosen_layers = [(n, linears[n]) for n in convert] if key == "fp8" else []
            with (
                torch.no_grad(),
                torch.random.fork_rng(devices=forked),
                torch.autocast(device.type, dtype=low),
                class_forward(model),
                _converted(chosen_layers, chosen, low),
            ):
                torch.manual_seed(seed)
                losses[key] = float(loss_fn(model(*args, **kwargs)).float())
    bf16_loss, fp8_loss = losses["bf16"], losses["fp8"]
    diff = (
        abs(fp8_loss - bf16_loss) / max(abs(bf16_loss), 1e-30)
        if bf16_loss is not None and fp8_loss is not None and math.isfinite(fp8_loss)
        else None
    )
    speedup = None
    speed = "speed not measured: needs an FP8 GPU (compute capability 8.9 or higher)"
    if cfp8.device_has_fp8(device):
        speedup = _speedup([(n, linears[n]) for n in convert], shapes, chosen, device)
        speed = (
            f"the converted layers' forward ran {speedup:.2f}x as fast in FP8 as in BF16"
            if speedup is not None
            else "speed not measured: no layer to convert"
        )
    return {
        "recipe": recipe,
        "recipes": list(RECIPES),
        "layers": layers,
        "convert": convert,
        "keep": keep,
        "filter": module_filter(keep, recipe),
        "loss_fp32": float(loss.detach()),
        "loss_bf16": bf16_loss,
        "loss_fp8": fp8_loss,
        "loss_rel_diff_vs_bf16": diff,
        "speedup": speedup,
        "speed": speed,
        "thresholds": asdict(THRESHOLDS),
        "amax_drift": "not measured: one batch (the amax of earlier steps is not seen)",
        "spent_s": time.perf_counter() - started,
    }
