"""Activation memory, counted from what autograd saved for the backward pass.

Definition (used by the memory collector and `ampdiag.memory_probe`): the *activations* of a
forward pass are the distinct storages autograd saved for its backward (each storage's full
size, counted once however many views of it were saved), except

* parameters themselves (their storage is a parameter's), and
* tensors computed from one parameter alone — autocast's low-precision weight copies and their
  transposes: the saved tensor's history is a chain of one-input autograd nodes (cast,
  transpose, view, scalar arithmetic) that ends at a parameter. A frozen parameter's cast has
  no history; a saved tensor with no history whose shape is a 2-D parameter's (or its
  transpose) is taken as such a cast.

These parameter copies are reported apart (``weight_cast_bytes``): their size does not depend
on the batch. Gradients are never saved tensors, so they are never counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from ampdiag.compat.autograd import saved_tensors
from ampdiag.sources.live.collectors.base import graph_nodes

#: How many one-input nodes a parameter's cast may pass through (cast, transpose, view, ...).
MAX_CAST_CHAIN = 8


@dataclass
class ParameterIndex:
    """What identifies parameters and their copies: tensor ids, storages, 2-D shapes."""

    ids: set[int] = field(default_factory=set)
    storages: set[int] = field(default_factory=set)
    shapes: set[tuple[int, ...]] = field(default_factory=set)

    @classmethod
    def of(cls, params: Iterable[torch.Tensor]) -> ParameterIndex:
        """Indexes the given parameters."""
        index = cls()
        for p in params:
            index.ids.add(id(p))
            index.storages.add(storage_ptr(p))
            if p.dim() == 2:
                index.shapes.add(tuple(p.shape))
                index.shapes.add(tuple(reversed(p.shape)))
        return index

    def derived(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a parameter or a copy of one parameter (module docstring)."""
        if storage_ptr(t) in self.storages:
            return True
        fn = t.grad_fn
        if fn is None:
            return not t.requires_grad and tuple(t.shape) in self.shapes
        for _ in range(MAX_CAST_CHAIN):
            nexts = fn.next_functions
            if len(nexts) != 1 or nexts[0][0] is None:
                return False
            fn = nexts[0][0]
            variable = getattr(fn, "variable", None)  # AccumulateGrad: the leaf it feeds
            if variable is not None:
                return id(variable) in self.ids
        return False


def storage_ptr(t: torch.Tensor) -> int:
    """The address of a tensor's storage (0 for tensors without one)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:
        return 0


def storage_bytes(t: torch.Tensor) -> int:
    """The size of a tensor's whole storage (what keeping it alive holds)."""
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        return int(t.numel() * t.element_size())


@dataclass
class SavedMemory:
    """What one backward graph holds: activation and parameter-copy storages by address."""

    activations: dict[int, int] = field(default_factory=dict)
    weight_casts: dict[int, int] = field(default_factory=dict)

    def add(self, t: torch.Tensor, params: ParameterIndex) -> None:
        """Counts one saved tensor (its storage once)."""
        ptr = storage_ptr(t)
        if ptr == 0 or ptr in params.storages:
            return
        target = self.weight_casts if params.derived(t) else self.activations
        if ptr not in self.activations and ptr not in self.weight_casts:
            target[ptr] = storage_bytes(t)

    @property
    def activation_bytes(self) -> int:
        """Bytes of the activation storages."""
        return sum(self.activations.values())

    @property
    def weight_cast_bytes(self) -> int:
        """Bytes of the parameters' copies (autocast casts)."""
        return sum(self.weight_casts.values())


def saved_by_graph(root: torch.Tensor, params: ParameterIndex) -> SavedMemory:
    """The saved storages of the graph behind ``root`` (e.g. the loss, before its backward)."""
    out = SavedMemory()
    if root.grad_fn is None:
        return out
    for node in graph_nodes(root.grad_fn):
        for t in saved_tensors(node):
            out.add(t, params)
    return out
