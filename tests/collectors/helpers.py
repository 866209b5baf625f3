"""Test-only views of the collectors' internals (kept out of the package)."""

from __future__ import annotations

import torch

from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors._exponents import raw_histograms


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
