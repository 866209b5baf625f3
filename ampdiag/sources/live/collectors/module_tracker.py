"""The module each op runs under, in the forward and in the backward.

Used by the precision audit (:mod:`ampdiag.sources.live.collectors.dtype_audit`) to attribute ops to
modules (``blocks.3.attn.proj``).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ampdiag.compat import autograd

ROOT = "<root>"
OUTSIDE = "<outside>"


def tensors_of(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in op arguments or outputs (nested lists/tuples/dicts, two levels)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            if isinstance(x, torch.Tensor):
                yield x
            elif isinstance(x, (list, tuple)):
                yield from (y for y in x if isinstance(y, torch.Tensor))
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors_of(x)


class ModuleTracker:
    """The module an op runs under, in the forward and in the backward.

    Forward: global module pre/post hooks keep the stack of modules entered; the innermost
    one is the op's module. Backward: autograd's own record (`ampdiag.compat.autograd`). At
    every module boundary of the forward the tracker notes the sequence number the next
    autograd node will get, so the nodes each module's ops made form runs of numbers; a
    backward op belongs to the module whose run holds the number of the node being executed
    (a gradient accumulation into a parameter, to the parameter's module). Modules that pass
    a tensor through unchanged (``Dropout(p=0)``, ``Identity``) make no node and so never take
    a neighbour's backward, whatever order gradient hooks would fire in.

    Not torch's public ``torch.utils.module_tracker.ModuleTracker``: it keeps an unordered
    set of parents (no innermost module) and attributes the backward through gradient hooks.
    """

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.active = True
        self.stack: list[str] = []
        self._seqs: list[int] = []
        self._owners: list[str] = []
        self._params: dict[int, str] = {}
        self._handles: list[Any] = []
        self._thread = threading.get_ident()  # another thread's modules are not this audit's
        from ampdiag.sources.live import global_hooks

        self._handles.append(global_hooks.add(global_hooks.MODULE_PRE, self._pre))
        self._handles.append(global_hooks.add(global_hooks.MODULE_POST, self._post))

    def name_of(self, module: torch.nn.Module) -> str:
        """The module's path from the root (``blocks.0.attn.proj``), or its class name."""
        return self.names.get(id(module)) or f"<{type(module).__name__}>"

    @property
    def current(self) -> str:
        """The innermost module entered (``<outside>`` when none)."""
        return self.stack[-1] if self.stack else OUTSIDE

    def _mark(self) -> None:
        """Notes that nodes made from now on belong to the current module."""
        seq = autograd.next_sequence_nr()
        if seq is None:
            return
        if self._seqs and self._seqs[-1] == seq:
            self._owners[-1] = self.current
        else:
            self._seqs.append(seq)
            self._owners.append(self.current)

    def backward_module(self) -> str:
        """The module whose forward made the autograd node now running its backward."""
        node = autograd.current_node()
        if node is None:
            return OUTSIDE
        variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter
        if isinstance(variable, torch.Tensor):
            return self._params.get(id(variable), OUTSIDE)
        seq = autograd.node_sequence_nr(node)
        if seq is None:
            return OUTSIDE
        i = bisect.bisect_right(self._seqs, seq) - 1
        return self._owners[i] if i >= 0 else OUTSIDE

    def enter_root(self, module: torch.nn.Module, args: Any) -> None:
        """The root's own entry (its pre-hook ran before our global hooks existed)."""
        for sub in module.modules():
            name = self.name_of(sub)
            for p in sub.parameters(recurse=False):
                self._params.setdefault(id(p), name)
        self._mark()
        self._pre(module, args)

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.active and threading.get_ident() == self._thread:
            self.stack.append(self.name_of(module))
            self._mark()

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self.active or threading.get_ident() != self._thread:
            return
        name = self.name_of(module)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] == name:
                del self.stack[i]
                break
        self._mark()

    def close(self) -> None:
        """Removes the hooks."""
        self.active = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.stack.clear()
