"""The true (FP32) gradients inside the model: what FP16 lost, and the loss scale it needs.

An FP16 backward cannot show what it flushed, so a share counted over the values that survived
understates the loss (docs/how-it-works.md, Numerics). The reference: the model's forward on a
sampled step's inputs with autocast off and a backward of the FP32 gradient that arrived at
the model's output (divided by the loss scale), before the optimizer step, on a hook-free copy
(`ampdiag.compat.modules.without_hooks`), under `ampdiag.compat.autocast.AutocastHeldOff` (a
forward that enters autocast itself, as Accelerate's ``prepare`` makes it, is held out of it).

Where the replay still is not FP32 (an explicit cast, FP16 parameters) or cannot run,
`ReplayError` says why and the caller reports the figures as unmeasured -- never the FP16
values' understated ones as if true. It changes nothing: ``torch.autograd.grad`` leaves every
``.grad`` alone, buffers are copied back, the RNG is forked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ampdiag.compat.autocast import AutocastHeldOff
from ampdiag.compat.modules import eager_copy_fix, uncompiled, upcast_copy, without_hooks
from ampdiag.sources.live.collectors._exponents import sample_view
from ampdiag.sources.live.collectors.base import graph_nodes, tensors_in

_LOW = (torch.float16, torch.bfloat16)
#: The largest output gradient kept for the replay (values): bounded memory.
MAX_OUTPUT_VALUES = 1 << 24
#: Values of each true gradient counted (all of them up to this many): a small strided sample
#: of a (batch, tokens, features) gradient sits at a few token positions, and a causal model's
#: gradients differ by position (a 1024-value sample misread one layer's share by 5 points).
REPLAY_VALUES = 1 << 20


class ReplayError(Exception):
    """The FP32 replay did not give true FP32 gradients; the message says why."""


@contextmanager
def replaying(
    model: torch.nn.Module, device: torch.device, upcast: bool = False
) -> Iterator[tuple[torch.nn.Module, dict[int, torch.nn.Module]]]:
    """The hook-free replica of ``model`` (`without_hooks`) and its origin map, for a replay.

    Inside: grad mode on and the RNG forked (the replay's dropout draws nothing the training
    sees; ``device``: the CUDA device whose generator to fork). On exit every buffer is
    copied back (BatchNorm's running statistics count the replayed batch otherwise). Shared
    by every replay of a step (this module's, `divergence_replay`'s). A compiled model
    (``torch.compile``) is replayed through the module it wraps, eagerly: its submodules are
    then seen one by one. ``upcast``: the replica's FP16/BF16 parameters and buffers are FP32
    copies (`upcast_copy`): a model stored in low precision (``model.half()``) replays in
    FP32 without touching its own weights.
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        # DDP's own forward readies its reducer for a backward of the parameters that the
        # replay never runs: the next real step would fail. The wrapped module computes alike.
        model = model.module
    model = uncompiled(model)[0]
    replica, origin = without_hooks(model)
    eager_copy_fix(replica)
    if upcast:
        upcast_copy(replica)
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            yield replica, origin
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def low_precision_state(model: torch.nn.Module) -> str | None:
    """The low-precision dtype the model's parameters are stored in ("float16"...), or None."""
    model = uncompiled(model)[0]
    found = next((p.dtype for p in model.parameters() if p.dtype in _LOW), None)
    return str(found).removeprefix("torch.") if found is not None else None


def upcast_inputs(value: Any) -> Any:
    """``value`` (a step's forward inputs) with its FP16/BF16 floating tensors as FP32 copies."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _LOW else value
    if isinstance(value, tuple):
        return tuple(upcast_inputs(v) for v in value)
    if isinstance(value, list):
        return [upcast_inputs(v) for v in value]
    if isinstance(value, dict):
        return {k: upcast_inputs(v) for k, v in value.items()}
    return value


def reference_gradients(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    grad_output: torch.Tensor,
    limit: int,
) -> list[tuple[torch.nn.Module, torch.Tensor, int]]:
    """(module, sample of the true gradient entering it, its size) for every module.

    At most ``limit`` values each (`_exponents.sample_view`), FP32, on the model's device.
    The samples are views: count them before the list goes.

    Raises:
        ReplayError: the replay is not FP32, or its output is not the step's.
    """
    outputs: list[torch.Tensor] = []
    owners: list[torch.nn.Module] = []
    held_off = AutocastHeldOff()
    with replaying(model, grad_output.device) as (replica, origin):

        def keep(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            t = next(tensors_in(output), None)
            if t is not None and t.requires_grad and t.is_floating_point():
                outputs.append(t)
                owners.append(origin[id(module)])

        handles = [m.register_forward_hook(keep) for m in replica.modules()]
        try:
            try:
                with held_off:
                    out = next(tensors_in(replica(*args)), None)
            except Exception as exc:  # an FP16-only kernel refusing FP32 inputs, say
                if held_off.low is None:
                    raise
                raise ReplayError(_low_precision(held_off.low)) from exc
            for h in handles:
                h.remove()
            if out is None or not out.requires_grad:
                raise ReplayError("the replayed forward returned no tensor that needs a gradient")
            if out.shape != grad_output.shape:
                raise ReplayError(
                    f"the replayed forward's output {tuple(out.shape)} is not the step's "
                    f"{tuple(grad_output.shape)}"
                )
            low = next((t.dtype for t in outputs if t.dtype in _LOW), None)
            if held_off.low is None and low is not None:
                held_off.low = f"a module's output is {low}"
            if held_off.low is not None:
                raise ReplayError(_low_precision(held_off.low))
            if held_off.entered and _recomputes(out):
                raise ReplayError(
                    "a checkpointed segment would recompute its forward under the model's own "
                    "autocast in the backward"
                )
            found = torch.autograd.grad(
                out,
                outputs,
                grad_outputs=grad_output.to(out.dtype),
                allow_unused=True,
                retain_graph=False,
            )
        finally:
            for h in handles:
                h.remove()
    return [
        (m, sample_view(g.detach().float(), limit), g.numel())
        for m, g in zip(owners, found, strict=True)
        if g is not None and g.numel()
    ]


def _low_precision(what: str) -> str:
    """The reason a replay is not FP32: which call computed in low precision."""
    return (
        "the model computes in low precision outside autocast "
        f"({what}: an explicit cast or FP16 parameters)"
    )


def _recomputes(out: torch.Tensor) -> bool:
    """Whether ``out``'s graph holds a reentrant checkpoint (it recomputes in the backward).

    Such a segment runs its forward again under the autocast state its forward began in,
    outside anything the replay holds off (a non-reentrant one notices the changed dtypes
    itself and raises).
    """
    return any(n.name().startswith("CheckpointFunctionBackward") for n in graph_nodes(out.grad_fn))
