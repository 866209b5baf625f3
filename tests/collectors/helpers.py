"""Test-only views of the collectors' internals (kept out of the package)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

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


class Spin(nn.Module):
    """A model whose forward spins a set CPU time of its thread: ``fp32_ms`` outside BF16
    autocast, ``bf16_ms`` inside it, so that two precisions' speed ratio is known beforehand.
    Run it with one intra-op thread: an idle OpenMP worker's spin-wait is process CPU time
    too, the A/B's clock."""

    def __init__(self, fp32_ms: float, bf16_ms: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.fp32_ms, self.bf16_ms = fp32_ms, bf16_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bf16 = torch.is_autocast_enabled("cpu") and (
            torch.get_autocast_dtype("cpu") == torch.bfloat16
        )
        t0 = time.thread_time()
        while time.thread_time() - t0 < (self.bf16_ms if bf16 else self.fp32_ms) / 1e3:
            pass
        return self.lin(x)
