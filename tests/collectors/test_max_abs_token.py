"""`_finite.max_abs_token`: one value that is non-finite exactly when a tensor holds an inf/NaN
and zero exactly when every value is zero -- what the sentinel reads of each step's gradients.

Truth per case: ``torch.isfinite(t).all()`` and ``(t == 0).all()`` over the tensors themselves.
The cases include finite values whose squares overflow (1e30) or underflow (1e-30) float32,
where a 2-norm alone would answer wrongly.
"""

from __future__ import annotations

import math

import pytest
import torch

from ampdiag.sources.live.collectors._finite import max_abs_token
from ampdiag.sources.live.collectors.sentinel import _grads_state


def _cases() -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(64, 32, generator=g), torch.randn(32, generator=g)]
    inf, nan = [t.clone() for t in base], [t.clone() for t in base]
    inf[1][3] = math.inf
    nan[0][5, 7] = math.nan
    return {
        "normal": base,
        "inf": inf,
        "nan": nan,
        "zeros": [torch.zeros(64, 32), torch.zeros(32)],
        "one-nonzero": [torch.zeros(64, 32), torch.zeros(32).index_fill_(0, torch.tensor(4), 1.0)],
        "huge": [torch.full((100,), 1e30), torch.full((3,), -3e38)],
        "tiny": [torch.full((100,), 1e-30), torch.zeros(3)],
        "subnormal": [torch.tensor([1e-45, 0.0])],
        "fp16-large": [torch.full((1000,), 60000.0, dtype=torch.float16)],
        "fp16-inf": [torch.tensor([1.0, math.inf], dtype=torch.float16)],
        "bf16": [torch.randn(128, generator=g).bfloat16() * 1e30],
        "float64": [torch.tensor([1e200, -1e200], dtype=torch.float64)],
        "cancelling": [torch.tensor([1.0, -1.0]), torch.zeros(3)],
        "inf-minus-inf": [torch.tensor([math.inf]), torch.tensor([-math.inf])],
        "sum-overflows": [torch.full((4,), 3e38)],
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_finite_and_zero_exactly_as_the_values_are(name: str) -> None:
    tensors = _cases()[name]
    finite = all(bool(torch.isfinite(t).all()) for t in tensors)
    zero = all(bool((t == 0).all()) for t in tensors)
    token = max_abs_token(tensors)
    assert token.shape == () and token.dtype == torch.float32
    value = float(token)
    assert math.isfinite(value) is finite
    assert (value == 0) is zero


@pytest.mark.parametrize("name", list(_cases()))
def test_the_sentinels_sums_decide_as_the_values_are(name: str) -> None:
    """The CPU check's reading of one sum per gradient (its fallback included)."""
    tensors = _cases()[name]
    finite = all(bool(torch.isfinite(t).all()) for t in tensors)
    zero = all(bool((t == 0).all()) for t in tensors)
    sums = [float(t.sum().float()) for t in tensors]
    assert _grads_state(tensors, sums) == (not finite, zero)
