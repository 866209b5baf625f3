"""What a pass over a copy of the user's model needs, shared by the A/B and the FP8 readiness.

The class's own forward (not a framework's autocast wrapper), and the error measure (SQNR).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: The SQNR of identical tensors (no noise), and its negative for non-finite noise: finite, so
#: that a session's JSON round-trips, and beyond what float64 arithmetic can resolve (~313 dB).
EXACT_SQNR_DB = 400.0


@contextmanager
def class_forward(model: torch.nn.Module) -> Iterator[None]:
    """Runs the class's forward where the instance's was replaced (a wrapped forward).

    Accelerate sets ``model.forward`` to the forward wrapped in autocast: through it the FP32
    pass would run under autocast too. The instance attribute is put back on exit.
    """
    wrapped = vars(model).get("forward")
    if wrapped is None:
        yield
        return
    del model.forward
    try:
        yield
    finally:
        model.forward = wrapped


def sqnr_db(ref: torch.Tensor, other: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``other`` against ``ref``, in dB (finite)."""
    ref, other = ref.detach().double(), other.detach().double()
    noise = float((ref - other).pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return EXACT_SQNR_DB
    if not math.isfinite(noise) or signal == 0.0:
        return -EXACT_SQNR_DB
    return max(-EXACT_SQNR_DB, min(EXACT_SQNR_DB, 10.0 * math.log10(signal / noise)))
