"""Activation memory measured without ampdiag: what autograd saves for the backward.

`saved_bytes` runs one forward + loss (training mode, gradients on, under the scenario's
autocast) inside ``torch.autograd.graph.saved_tensors_hooks`` and sums the distinct storages
saved, minus

* parameters (the storage is a parameter's), and
* the parameters' copies (autocast's casts and their transposes), recognised by *value*: a
  saved tensor equal to a parameter (or its transpose) cast to the saved tensor's dtype.

ampdiag recognises the copies another way (by their autograd history), so the two counts are
independent. Buffers (BatchNorm statistics) are restored and the RNG is forked, so measuring
changes nothing in the run that follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _is_param_copy(t: torch.Tensor, params: list[torch.Tensor]) -> bool:
    for p in params:
        for candidate in (p, p.t()) if p.dim() == 2 else (p,):
            if candidate.shape == t.shape and torch.equal(candidate.detach().to(t.dtype), t):
                return True
    return False


def saved_bytes(
    model: nn.Module,
    x: Any,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    dtype: torch.dtype | None,
) -> dict[str, int]:
    """``{"activations": bytes, "parameter_copies": bytes}`` saved by one forward + loss."""
    params = list(model.parameters())
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    acts: dict[int, int] = {}
    copies: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in param_storages or ptr in acts or ptr in copies:
            return t
        (copies if _is_param_copy(t, params) else acts)[ptr] = storage.nbytes()
        return t

    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    autocast = torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None)
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with torch.random.fork_rng(devices=[]), hooks:
        with autocast:
            out = model(x)
        loss = loss_fn(out.float(), y)
    del out, loss
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    return {"activations": sum(acts.values()), "parameter_copies": sum(copies.values())}
