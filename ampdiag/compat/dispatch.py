"""Running ampdiag's own small tensor ops below autograd (checked on torch 2.4 .. 2.13).

``torch._C._AutoDispatchBelowADInplaceOrView`` is the guard torch's own kernels use to skip
the Autograd and ADInplaceOrView dispatch keys. Statistics that only read gradients into
ampdiag's own buffers have no graph to record, no view to track and no version counter to
bump, so under the guard each of their ops costs a little less dispatch (a sampled step's
gradient gather is a few dozen small ops). Without the guard (another torch version) it is a
null context: the same results, a little slower.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

_GUARD: Any = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)


def below_autograd() -> contextlib.AbstractContextManager[Any]:
    """A context in which ops skip autograd and view tracking (reads into own buffers only)."""
    if _GUARD is None:
        return contextlib.nullcontext()
    guard: contextlib.AbstractContextManager[Any] = _GUARD()
    return guard
