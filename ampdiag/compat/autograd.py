"""Autograd's own record of which forward op a backward op comes from (torch 2.4 .. 2.13).

Every autograd node carries the *sequence number* the thread's counter had when the forward
op that made it ran (``node._sequence_nr()``), and while the engine runs a node's backward
``torch._C._current_autograd_node()`` returns that node. Reading the counter during the
forward (``torch._C._autograd._get_sequence_nr()``: the number the next node will get) at
each module boundary therefore tells, for any backward op, which module's forward made the node it
belongs to: no hook on the graph, nothing changed. Fallbacks: None (the caller attributes
the op some other way).
"""

from __future__ import annotations

from typing import Any

import torch

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
