"""Test-only views of the collectors' internals (kept out of the package)."""

from __future__ import annotations

from typing import Any

import torch

from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors._exponents import (
    sampled_signed_histograms,
    signed_histograms_of,
)


def raw_histograms(tensors: list[torch.Tensor], limit: int, cache: dict[Any, Any]) -> torch.Tensor:
    """Per-tensor exponent histograms of at most ``limit`` values each, (n, 256) int64."""
    return sampled_signed_histograms([t.detach() for t in tensors], limit, cache).sum(dim=1)


def histograms(samples: list[torch.Tensor]) -> torch.Tensor:
    """Exponent histograms of whole tensors, one row each, (n, 256) int64."""
    return signed_histograms_of(samples).sum(dim=1)


def raw_histogram(t: torch.Tensor, limit: int) -> torch.Tensor:
    """One tensor's exponent histogram (256 bins, int64, on its device)."""
    return raw_histograms([t], limit, {})[0]


def module_callbacks(module: torch.nn.Module) -> int:
    """How many `on_module` callbacks ampdiag holds for ``module`` (what a hook count was)."""
    key = id(module)
    tables = global_hooks._SHARED
    hooks = (tables[global_hooks.MODULE_PRE], tables[global_hooks.MODULE_POST])
    return sum(
        len(shared.by_module.get(key, ()))
        + len(shared.inputs.get(key, ()))
        + len(shared.with_kwargs.get(key, ()))
        for shared in hooks
    )
