"""torch's private fused multi-tensor ops (``torch._foreach_*``), with a loop where one is missing.

``_foreach_norm`` and ``_foreach_copy_`` run one kernel (or one dispatch) for a whole list of
tensors, which is what keeps a sampled step's statistics cheap. They are private (a torch
release may change or drop them), so each has a plain per-tensor fallback with the same
results.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_NORM = getattr(torch, "_foreach_norm", None)
_COPY = getattr(torch, "_foreach_copy_", None)


def foreach_norm(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The 2-norm of each tensor (0-dim tensors, in order)."""
    if _NORM is not None:
        return list(_NORM(list(tensors)))
    return [torch.linalg.vector_norm(t) for t in tensors]


def foreach_copy_(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """Copies each ``src[i]`` into ``dst[i]``, converting the dtype as ``Tensor.copy_`` does."""
    if _COPY is not None:
        _COPY(list(dst), list(src))
        return
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)
