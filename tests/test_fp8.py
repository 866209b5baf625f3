"""FP8 numerics of the A/B against a direct ``torch._scaled_mm`` and plain casts, to the bit."""

from __future__ import annotations

import pytest
import torch

from ampdiag.sources.live import fp8

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _cast(x: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor) -> tuple[torch.Tensor, ...]:
    scale = (torch.finfo(dtype).max / amax.double()).float()
    top = torch.finfo(dtype).max
    return (x * scale).clamp(-top, top).to(dtype), 1.0 / scale


@pytest.fixture
def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=g)
    x[:, 3] *= 100.0
    return x, torch.randn(48, 32, generator=g) * 0.1, torch.randn(64, 48, generator=g) * 1e-3


def test_tensorwise_matches_direct_scaled_mm(operands: tuple[torch.Tensor, ...]) -> None:
    x, w, go = operands
    qx, sx = _cast(x, E4M3, x.abs().max())
    qw, sw = _cast(w, E4M3, w.abs().max())
    qg, sg = _cast(go, E5M2, go.abs().max())
    want_out = torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw, out_dtype=torch.float32)
    want_gi = torch._scaled_mm(qg, qw.t().contiguous().t(), scale_a=sg, scale_b=sw,
                               out_dtype=torch.float32)  # fmt: skip
    want_gw = torch._scaled_mm(qg.t().contiguous(), qx.t().contiguous().t(), scale_a=sg,
                               scale_b=sx, out_dtype=torch.float32)  # fmt: skip
    out, gi, gw, _ = fp8.fp8_matmuls(x, w, go, fp8.RECIPES["tensorwise"])
    assert torch.equal(out, want_out)
    assert torch.equal(gi, want_gi)
    assert torch.equal(gw, want_gw)


def test_delayed_uses_the_history_amax_and_counts_saturation(
    operands: tuple[torch.Tensor, ...],
) -> None:
    x, w, go = operands
    amax = {"input": x.abs().max() / 4, "weight": w.abs().max(), "grad_output": go.abs().max()}
    qx, sx = _cast(x, E4M3, amax["input"])
    qw, sw = _cast(w, E4M3, amax["weight"])
    want = torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw, out_dtype=torch.float32)
    out, _, _, stats = fp8.fp8_matmuls(x, w, go, fp8.RECIPES["delayed"], amax=amax)
    assert torch.equal(out, want)
    # the values beyond a quarter of the amax saturate: counted by hand
    assert stats["input"]["saturated_share"] == int((x.abs() > x.abs().max() / 4).sum()) / x.numel()


def test_rowwise_matches_per_row_power_of_two_casts(operands: tuple[torch.Tensor, ...]) -> None:
    x, w, go = operands

    def rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        amax = t.abs().amax(dim=-1, keepdim=True).double()
        scale = torch.exp2(torch.floor(torch.log2((448.0 / amax).float())))
        return (t * scale).clamp(-448, 448).to(E4M3), 1.0 / scale

    qx, sx = rows(x)
    qw, sw = rows(w)
    want = torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.float32)
    out, _, _, _ = fp8.fp8_matmuls(x, w, go, fp8.RECIPES["rowwise"])
    assert torch.equal(out, want)


def test_matches_torchao_where_installed(operands: tuple[torch.Tensor, ...]) -> None:
    """torchao's own Float8Linear (tensorwise) gives the same output, to the bit."""
    pytest.importorskip("torchao.float8")
    from torchao.float8 import convert_to_float8_training

    x, w, _ = operands
    layer = torch.nn.Linear(32, 48, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    model = torch.nn.Sequential(layer)
    convert_to_float8_training(model)
    got = model(x)
    out, _, _, _ = fp8.fp8_matmuls(x, w, torch.zeros(64, 48), fp8.RECIPES["tensorwise"])
    assert torch.equal(got.float(), out)
