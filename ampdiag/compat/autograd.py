"""Private autograd attributes: the tensors a graph node saved for its backward.

Every generated autograd node exposes what it saved as ``_saved_<name>`` attributes (the names
torchviz reads; checked on torch 2.4 - 2.13); a custom ``torch.autograd.Function`` node exposes
them as ``saved_tensors``. Reading one unpacks the saved variable: a tensor sharing the saved
storage, no copy. `saved_tensors` yields nothing for a node whose attributes are missing or
already freed, so the caller sees an incomplete count, never an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _names(node: Any) -> tuple[str, ...]:
    kind = type(node)
    names = _SAVED_NAMES.get(kind)
    if names is None:
        names = tuple(
            n
            for n in dir(node)
            if n.startswith("_saved_") and not n.endswith(("_sym_sizes", "_sym_strides"))
        )
        _SAVED_NAMES[kind] = names
    return names


def saved_tensors(node: Any) -> Iterator[torch.Tensor]:
    """The tensors one autograd node keeps for its backward (never raises)."""
    values: list[Any] = []
    try:
        for name in _names(node):
            values.append(getattr(node, name))
        if not values and hasattr(node, "saved_tensors"):  # custom autograd.Function
            values.extend(node.saved_tensors)
    except Exception:  # freed (backward already ran) or an attribute torch changed
        return
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))
