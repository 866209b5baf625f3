"""The GradScaler's private state, read without host syncs (checked on torch 2.4 .. 2.13).

``torch.amp.GradScaler`` keeps its scale as a 0-dim device tensor ``_scale`` (created lazily at
the first ``scale()``), its per-optimizer progress in ``_per_optimizer_states[id(opt)]``
(``stage``: READY / UNSCALED / STEPPED, ``found_inf_per_device``: device -> 0-dim tensor
holding 1.0 when an inf/NaN was found) until ``update()`` clears it. Every function here reads
that state without calling ``.item()``; when an attribute is missing (another torch version, a
scaler-like object) it returns None or a neutral value and ampdiag reports less.
"""

from __future__ import annotations

from typing import Any

import torch


def is_enabled(scaler: Any) -> bool:
    """Whether the scaler scales at all (a CPU run with ``GradScaler()`` disables itself)."""
    try:
        return bool(scaler.is_enabled())
    except Exception:
        return bool(getattr(scaler, "_enabled", False))


def device(scaler: Any) -> str:
    """The device type the scaler was built for ("cuda" by default)."""
    return str(getattr(scaler, "_device", ""))


def scale_tensor(scaler: Any) -> torch.Tensor | None:
    """The live scale tensor (0-dim, on the device), or None before the first ``scale()``.

    The tensor is updated in place by ``update()``: clone it to keep a step's value.
    """
    if scaler is None or not is_enabled(scaler):
        return None
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def settings(scaler: Any) -> dict[str, float]:
    """init_scale, growth_factor, backoff_factor and growth_interval, where readable."""
    out: dict[str, float] = {}
    for key in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
        value = getattr(scaler, f"_{key}", None)
        if isinstance(value, (int, float)):
            out[key] = float(value)
    return out


def _state(scaler: Any, optimizer: Any) -> dict[str, Any] | None:
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict):
        return None
    # .get() on the defaultdict does not create an entry: reading never changes the scaler.
    state = states.get(id(optimizer))
    return state if isinstance(state, dict) else None


def stage(scaler: Any, optimizer: Any) -> str:
    """The optimizer's stage in this iteration: "ready", "unscaled" or "stepped".

    "ready" also when the scaler has no record of it yet (gradients are still scaled).
    """
    state = _state(scaler, optimizer)
    if state is None:
        return "ready"
    value = state.get("stage")
    name = getattr(value, "name", str(value))
    return str(name).lower()


def any_unscaled(scaler: Any) -> bool:
    """Whether ``unscale_`` (or an unscaling ``step``) already ran for some optimizer."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict):
        return False
    for state in list(states.values()):
        name = str(getattr(state.get("stage"), "name", state.get("stage"))).lower()
        if name in ("unscaled", "stepped"):
            return True
    return False


def found_inf(scaler: Any, optimizer: Any) -> list[torch.Tensor]:
    """The optimizer's found-inf tensors of this iteration (device tensors; no sync)."""
    state = _state(scaler, optimizer)
    if state is None:
        return []
    per_device = state.get("found_inf_per_device") or {}
    return [t for t in per_device.values() if isinstance(t, torch.Tensor)]
