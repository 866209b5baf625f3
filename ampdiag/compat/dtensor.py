"""DTensor and FSDP2 (``fully_shard``): the local shard of a tensor, and FSDP2's policies.

A DTensor (what FSDP2 makes of every parameter and gradient) is a wrapper: most ops on it are
collectives or unsupported (``as_strided``), and its ``numel()`` is the global size. What this
rank holds, and what the statistics and memory figures of one rank are about, is its local
shard: ``DTensor.to_local()`` (public). The DTensor class moved from ``torch.distributed._tensor``
(torch 2.4, private) to ``torch.distributed.tensor`` (2.5+); FSDP2's mixed-precision policy is
kept on the module's private FSDP state (``FSDPModule._get_fsdp_state()._mp_policy``, checked
on torch 2.6-2.13). Without torch.distributed, nothing is a DTensor and no module is FSDP2's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.lru_cache(maxsize=1)
def _dtensor_class() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # type: ignore[attr-defined,no-redef,unused-ignore]  # torch 2.4
        except ImportError:
            return None
    cls: type = DTensor
    return cls


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor."""
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (no autograd record); any other tensor as it is."""
    if not is_dtensor(t):
        return t
    with torch.no_grad():
        local: torch.Tensor = t.to_local()  # type: ignore[attr-defined]
    return local


def _fsdp_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import (  # type: ignore[attr-defined,no-redef,unused-ignore]  # torch 2.4-2.5
                FSDPModule,
            )
        except ImportError:
            return None
    cls: type = FSDPModule
    return cls


def _dtype_name(d: Any) -> str | None:
    return str(d).removeprefix("torch.") if isinstance(d, torch.dtype) else None


def fsdp_mixed_precision(model: torch.nn.Module) -> list[dict[str, Any]]:
    """FSDP2's ``MixedPrecisionPolicy`` of each ``fully_shard`` module of ``model``.

    Returns:
        One dict per FSDP2 module: ``module`` (its name, "" for the root), ``param_dtype``,
        ``reduce_dtype``, ``output_dtype`` (dtype names or None: "as the parameters") and
        ``cast_forward_inputs``. Empty where there is no FSDP2 module or its state moved.
    """
    cls = _fsdp_module_class()
    if cls is None:
        return []
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, cls):
            continue
        try:
            policy = module._get_fsdp_state()._mp_policy  # type: ignore[attr-defined]
        except Exception:
            continue
        out.append(
            {
                "module": name,
                "param_dtype": _dtype_name(getattr(policy, "param_dtype", None)),
                "reduce_dtype": _dtype_name(getattr(policy, "reduce_dtype", None)),
                "output_dtype": _dtype_name(getattr(policy, "output_dtype", None)),
                "cast_forward_inputs": bool(getattr(policy, "cast_forward_inputs", False)),
            }
        )
    return out
