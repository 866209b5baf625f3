"""The true (FP32) gradients inside the model, for the loss scale FP16 needs.

An FP16 backward cannot show what it flushed: a gradient that underflowed is a zero like any
other, so a scale chosen from the FP16 gradients that survived is too small exactly when the
scale in use is far too small. The reference is an FP32 replay: the model's forward on a
sampled step's inputs with autocast off, and a backward of the FP32 gradient that arrived at
the model's output in that step (captured at the autocast boundary, divided by the loss scale)
-- so every module's incoming gradient is the true value FP16 should have held.

Run once, at the end of the run (parameters are the final ones, not that step's: close enough
for a power-of-two scale). It observes and never changes: ``torch.autograd.grad`` leaves every
``.grad`` alone, buffers are copied back, and the RNG is forked (dropout draws nothing the
training would see).
"""

from __future__ import annotations

from typing import Any

import torch

from ampdiag.sources.live.collectors._exponents import sample_view, signed_histograms_of
from ampdiag.sources.live.collectors.base import tensors_in

#: The largest output gradient kept for the replay (values): bounded memory.
MAX_OUTPUT_VALUES = 1 << 24


def reference_exponents(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    grad_output: torch.Tensor,
    limit: int,
) -> dict[int, int]:
    """{log2 exponent: count} of the true gradients entering every module.

    At most ``limit`` values each, as the FP16 histograms are sampled; empty when the replay
    cannot run.
    """
    grads: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        t = next(tensors_in(output), None)
        if t is not None and t.requires_grad and t.is_floating_point():
            outputs.append(t)

    outputs: list[torch.Tensor] = []
    handles = [m.register_forward_hook(keep) for m in model.modules()]
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [grad_output.device.index or 0] if grad_output.is_cuda else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            with torch.autocast(grad_output.device.type, enabled=False):
                out = next(tensors_in(model(*args)), None)
            for h in handles:
                h.remove()
            if out is None or out.shape != grad_output.shape or not out.requires_grad:
                return {}
            found = torch.autograd.grad(
                out,
                outputs,
                grad_outputs=grad_output.to(out.dtype),
                allow_unused=True,
                retain_graph=False,
            )
            grads = [g for g in found if g is not None and g.numel()]
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)
    if not grads:
        return {}
    samples = [sample_view(g.detach().float(), limit).reshape(-1) for g in grads]
    hist = signed_histograms_of(samples, [0] * len(samples), 1).sum(dim=1)[0].tolist()
    return {e - 127: int(c) for e, c in enumerate(hist) if 0 < e < 255 and c}
