"""``ampdiag.memory_probe``: measure activation memory at two batch sizes, changing nothing.

Activation memory is what autograd keeps from the forward pass for the backward pass. The probe
runs the model's forward (training mode, gradients on) at each batch size and counts, through
``torch.autograd.graph.saved_tensors_hooks``, the bytes of every distinct storage autograd saves,
parameters and their autocast copies excluded (the definition in
`ampdiag.sources.live.saved_activations`). On CUDA it also reports the forward's peak above
the starting allocation (``torch.cuda.max_memory_allocated``). It never runs backward or an
optimizer: parameters, gradients and optimizer state are untouched; buffers (BatchNorm
statistics) and the RNG states are restored afterwards. Call it before the training loop (or
before ``diagnose()``); when a ``diagnose()`` block is running, the result is also recorded in
its memory section.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from ampdiag.sources.live.collectors.base import internal_work
from ampdiag.sources.live.saved_activations import ParameterIndex, SavedMemory


def _as_args(batch: Any) -> tuple[tuple[Any, ...], Any]:
    """make_batch may return ``inputs`` or ``(inputs, target)``; inputs may be a tuple."""
    if isinstance(batch, tuple) and len(batch) == 2:
        inputs, target = batch
    else:
        inputs, target = batch, None
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return args, target


def _saved_bytes(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    autocast: tuple[str, torch.dtype] | None,
) -> tuple[int, int | None]:
    params = ParameterIndex.of(model.parameters())
    saved = SavedMemory()

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.add(t, params)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    with torch.enable_grad(), internal_work(), saved_tensors_hooks(pack, unpack):
        if autocast is not None:
            with torch.autocast(autocast[0], dtype=autocast[1]):
                out = model(*args)
                loss = loss_fn(out, target) if loss_fn is not None else None
        else:
            out = model(*args)
            loss = loss_fn(out, target) if loss_fn is not None else None
    peak = None
    if cuda:
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device) - start)
    del out, loss
    gc.collect()
    return saved.activation_bytes, peak


def memory_probe(
    model: torch.nn.Module,
    make_batch: Callable[[int], Any],
    *,
    batch_sizes: Sequence[int] = (2, 4),
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | str | None = None,
    compare_fp32: bool = True,
    record: bool = True,
) -> dict[str, Any]:
    """Measures activation memory at two (or more) batch sizes without changing any state.

    Args:
        model: The model, on its device, in the mode it trains in.
        make_batch: ``make_batch(n)`` returns a batch of ``n`` samples: the model's input (a
            tensor or a tuple of arguments), or ``(input, target)`` when ``loss_fn`` needs one.
        batch_sizes: At least two distinct batch sizes (small ones are enough: the fit is
            linear).
        loss_fn: ``loss_fn(output, target)``; include it so the loss's saved tensors count.
        autocast_dtype: Measure under ``torch.autocast`` with this dtype (e.g. torch.bfloat16).
        compare_fp32: With ``autocast_dtype``, also measure without autocast (FP32
            activations) for the what-if table.
        record: Record the result in the running ``diagnose()`` block's memory section.

    Returns:
        ``{"points": [[batch, bytes], ...], "per_sample_bytes", "fixed_bytes",
        "autocast_dtype", "fp32_points" (when compared), "cuda_forward_peak": [[batch, bytes]]
        (CUDA only), "device"}``.

    Raises:
        ValueError: Fewer than two distinct batch sizes.

    Example:
        >>> probe = ampdiag.memory_probe(  # doctest: +SKIP
        ...     model, lambda n: (torch.randn(n, 64), torch.randint(0, 10, (n,))),
        ...     loss_fn=torch.nn.functional.cross_entropy, autocast_dtype=torch.bfloat16)
    """
    from ampdiag.analysis.memory_estimates import fit_linear

    sizes = [int(b) for b in batch_sizes]
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise ValueError("memory_probe needs at least two distinct batch sizes >= 1")
    dtype: torch.dtype | None = (
        getattr(torch, autocast_dtype) if isinstance(autocast_dtype, str) else autocast_dtype
    )
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    autocast = (device.type, dtype) if dtype is not None else None
    points: list[list[int]] = []
    fp32_points: list[list[int]] = []
    peaks: list[list[int]] = []
    try:
        for n in sizes:
            args, target = _as_args(make_batch(n))
            saved, peak = _saved_bytes(model, args, target, loss_fn, autocast)
            points.append([n, saved])
            if peak is not None:
                peaks.append([n, peak])
            if autocast is not None and compare_fp32:
                saved32, _ = _saved_bytes(model, args, target, loss_fn, None)
                fp32_points.append([n, saved32])
            del args, target
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    fit = fit_linear(points) or {}
    result: dict[str, Any] = {
        "device": str(device),
        "points": points,
        "per_sample_bytes": fit.get("per_sample_bytes"),
        "fixed_bytes": fit.get("fixed_bytes"),
        "autocast_dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
    }
    if fp32_points:
        result["fp32_points"] = fp32_points
    if peaks:
        result["cuda_forward_peak"] = peaks
    if record:
        from ampdiag.sources.live.collectors.base import running

        run = running()
        if run is not None:
            run.memory_probes.append(result)
    return result
