"""Dispatcher internals: ops below autograd, an op's schema name, torch's FLOP formulas.

Checked on torch 2.4 .. 2.13.

``torch._C._AutoDispatchBelowADInplaceOrView`` is the guard torch's own kernels use to skip
the Autograd and ADInplaceOrView dispatch keys. Statistics that only read gradients into
ampdiag's own buffers have no graph to record, no view to track and no version counter to
bump, so under the guard each of their ops costs a little less dispatch (a sampled step's
gradient gather is a few dozen small ops). Without the guard (another torch version) it is a
null context: the same results, a little slower.

An ``OpOverload`` (what a TorchDispatchMode receives) names itself through private attributes
(``_schema``, ``_overloadname``, ``_overloadpacket``), and ``torch.utils.flop_counter`` keeps
its FLOP formulas in the module-level ``flop_registry``; both are read here only.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

_GUARD: Any = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)


def op_name(func: Any) -> tuple[str, str]:
    """An op's name without its namespace and its overload, e.g. ``("mm", "default")``."""
    return func._schema.name.split("::", 1)[-1], str(func._overloadname)


def flop_formula(func: Any) -> Any:
    """Torch's FLOP formula for an op (as `FlopCounterMode` counts it), or None where none."""
    from torch.utils import flop_counter

    registry = getattr(flop_counter, "flop_registry", None)
    return registry.get(func._overloadpacket) if registry is not None else None


def below_autograd() -> contextlib.AbstractContextManager[Any]:
    """A context in which ops skip autograd and view tracking (reads into own buffers only)."""
    if _GUARD is None:
        return contextlib.nullcontext()
    guard: contextlib.AbstractContextManager[Any] = _GUARD()
    return guard
