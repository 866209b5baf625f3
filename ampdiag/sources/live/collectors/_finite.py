"""Whether every value of many tensors is finite, and whether all are zero: one 0-dim value.

The sentinel asks it of each step's parameter gradients (and its replay keeper before the
optimizer step): a gradient that is inf/NaN, or gradients that are all zero. The largest |x|
(``torch.nn.utils.get_total_norm(ts, inf)``) answers both, but on the CPU torch's inf-norm
takes a slow, non-vectorized path, several times its fused 2-norm, which a small model's
step then pays on every step (README, ``bench_window``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ampdiag.compat.autograd import version
from ampdiag.compat.foreach import foreach_norm

_FP32_MAX = torch.finfo(torch.float32).max
# The last answer, and the tensors it was for (weak references and version counters): the
# sentinel and its replay keeper both ask it of a step's gradients, one after the other.
# One tuple, replaced whole: a thread reads a key and its answer together.
_LAST: list[tuple[list[tuple[Any, int]], torch.Tensor | None]] = [([], None)]


def max_abs_token(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A 0-dim float32 tensor, non-finite exactly when a value is, zero exactly when all are.

    On the CPU the 2-norm (one fused pass) is read first -- no device to wait for -- and it
    decides when it is finite and not zero; otherwise (a real inf/NaN, all zeros, or finite
    values whose squares overflow or underflow the dtype) the largest |x| decides. On a GPU
    the largest |x| is cheap and needs no read.
    """
    tensors = list(tensors)
    key = [(weakref.ref(t), version(t)) for t in tensors]
    last, cached = _LAST[0]
    if (
        cached is not None
        and len(key) == len(last)
        and all(r() is t and v == w for t, (r, v), (_, w) in zip(tensors, last, key, strict=True))
    ):
        return cached  # the same tensors, unchanged since: asked twice in one step
    token = _max_abs_token(tensors)
    _LAST[0] = (key, token)
    return token


def _max_abs_token(tensors: list[torch.Tensor]) -> torch.Tensor:
    if all(t.device.type == "cpu" for t in tensors):
        norms = foreach_norm(tensors)
        dtypes = {n.dtype for n in norms}
        stacked = (
            torch.stack(norms) if len(dtypes) == 1 else torch.stack([n.float() for n in norms])
        )
        quick: torch.Tensor = torch.linalg.vector_norm(stacked.double())
        value = float(quick)
        if math.isfinite(value) and value > 0:
            return torch.tensor(min(value, _FP32_MAX), dtype=torch.float32)
    largest: torch.Tensor = torch.nn.utils.get_total_norm(tensors, math.inf).double()
    # a finite float64 value beyond float32's range stays finite
    return torch.where(torch.isfinite(largest), largest.clamp(max=_FP32_MAX), largest).float()
