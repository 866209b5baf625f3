"""Whether every value of many tensors is finite, and whether all are zero: one 0-dim value.

The sentinel asks it of each step's parameter gradients (and its replay keeper before the
optimizer step): a gradient that is inf/NaN, or gradients that are all zero. The largest |x|
(``torch.nn.utils.get_total_norm(ts, inf)``) answers both, but on the CPU torch's inf-norm
takes a slow, non-vectorized path, several times its fused 2-norm, which a small model's
step then pays on every step (README, ``bench_window``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ampdiag.compat.foreach import foreach_norm

_FP32_MAX = torch.finfo(torch.float32).max


def max_abs_token(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A 0-dim float32 tensor, non-finite exactly when a value is, zero exactly when all are.

    On the CPU the 2-norm (one fused pass, the per-tensor norms combined in Python's float64
    ``math.hypot``) is read first -- no device to wait for -- and it decides when it is finite
    and not zero; otherwise (a real inf/NaN, all zeros, or finite values whose squares
    overflow or underflow the dtype) the largest |x| decides. On a GPU the largest |x| is
    cheap and needs no read.
    """
    tensors = list(tensors)
    if all(t.device.type == "cpu" for t in tensors):
        norms = [n if n.dtype == torch.float32 else n.float() for n in foreach_norm(tensors)]
        value = math.hypot(*torch.stack(norms).tolist())
        if math.isfinite(value) and value > 0:
            return torch.tensor(min(value, _FP32_MAX), dtype=torch.float32)
    largest: torch.Tensor = torch.nn.utils.get_total_norm(tensors, math.inf).double()
    # a finite float64 value beyond float32's range stays finite
    return torch.where(torch.isfinite(largest), largest.clamp(max=_FP32_MAX), largest).float()
