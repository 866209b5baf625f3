"""Private autograd attributes: what a graph node saved, and which forward op made it.

- The tensors a node saved for its backward: every generated autograd node exposes them as
  ``_saved_<name>`` attributes (the names torchviz reads; checked on torch 2.4 - 2.13); a
  custom ``torch.autograd.Function`` node as ``saved_tensors``. Reading one unpacks the saved
  variable: a tensor sharing the saved storage, no copy. `saved_tensors` yields nothing for a
  node whose attributes are missing or already freed, so the caller sees an incomplete count,
  never an error.
- Which forward op a backward op comes from: every autograd node carries the *sequence number*
  the thread's counter had when the forward op that made it ran (``node._sequence_nr()``), and
  while the engine runs a node's backward ``torch._C._current_autograd_node()`` returns that
  node. Reading the counter during the forward (``torch._C._autograd._get_sequence_nr()``: the
  number the next node will get) at each module boundary therefore tells, for any backward op,
  which module's forward made the node it belongs to: no hook on the graph, nothing changed.
  Fallbacks: None (the caller attributes the op some other way).
- Whether a tensor was changed in place since it was last seen: its version counter
  (``tensor._version``), which every in-place op bumps.
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


_PEEK: Any = getattr(torch._C._autograd, "_get_sequence_nr", None)
_CURRENT: Any = getattr(torch._C, "_current_autograd_node", None)

#: The sequence number of nodes not made by a forward op (AccumulateGrad): UINT64_MAX.
NO_SEQUENCE = 2**64 - 1


def next_sequence_nr() -> int | None:
    """The sequence number the next autograd node made on this thread will get, if known."""
    if _PEEK is None:
        return None
    try:
        return int(_PEEK())
    except Exception:
        return None


def current_node() -> Any:
    """The autograd node whose backward is running on this thread (None outside one)."""
    if _CURRENT is None:
        return None
    try:
        return _CURRENT()
    except Exception:
        return None


def node_sequence_nr(node: Any) -> int | None:
    """A node's sequence number (None when unknown or not made by a forward op)."""
    get = getattr(node, "_sequence_nr", None)
    if get is None:
        return None
    try:
        seq = int(get())
    except Exception:
        return None
    return None if seq == NO_SEQUENCE else seq


def available() -> bool:
    """Whether backward ops can be attributed through sequence numbers here."""
    return _PEEK is not None and _CURRENT is not None


def version(t: torch.Tensor) -> int:
    """The tensor's version counter: it grows with every in-place change of its values."""
    return int(t._version)
