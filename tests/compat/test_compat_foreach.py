"""The fused multi-tensor ops and their per-tensor fallbacks give the same results."""

import pytest
import torch

from ampdiag.compat import foreach


def test_fallbacks_match_the_fused_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    tensors = [torch.randn(5), torch.randn(3, 4, dtype=torch.float16), torch.tensor([float("nan")])]
    fused = [n.float() for n in foreach.foreach_norm(tensors)]
    fused_dst = [torch.empty(t.shape) for t in tensors]
    foreach.foreach_copy_(fused_dst, tensors)
    monkeypatch.setattr(foreach, "_NORM", None)
    monkeypatch.setattr(foreach, "_COPY", None)
    loop = [n.float() for n in foreach.foreach_norm(tensors)]
    loop_dst = [torch.empty(t.shape) for t in tensors]
    foreach.foreach_copy_(loop_dst, tensors)
    for a, b in zip(fused, loop, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
    for a, b, src in zip(fused_dst, loop_dst, tensors, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()) and a.dtype == torch.float32
        torch.testing.assert_close(a, src.float(), equal_nan=True)
