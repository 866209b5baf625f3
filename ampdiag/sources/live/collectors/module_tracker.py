"""The innermost module each op runs under, in the forward and in the backward.

Used by the precision audit (:mod:`ampdiag.sources.live.collectors.dtype_audit`) to attribute ops to
modules (``blocks.3.attn.proj``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

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


def _is_ancestor(outer: str, inner: str) -> bool:
    """Whether module path ``outer`` contains ``inner`` (the root contains every module)."""
    if outer == inner:
        return False
    return outer == ROOT or inner.startswith(outer + ".")


class ModuleTracker:
    """The innermost module an op runs under, in the forward and in the backward.

    Forward: global module pre/post hooks. Backward (as torch.utils.module_tracker does): a
    multi-grad hook on a module's outputs marks it entered when their gradients are ready, one
    on its inputs marks it left when theirs are.

    Not torch's public ``ModuleTracker``: it keeps an unordered set of parents (no innermost
    module), names modules itself, and cannot be closed while backward hooks are pending.
    """

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.active = True
        self.stack: list[str] = []
        self._handles: list[Any] = []
        self._grad_handles: list[Any] = []
        from torch.nn.modules import module as nn_module

        self._handles.append(nn_module.register_module_forward_pre_hook(self._pre))
        self._handles.append(nn_module.register_module_forward_hook(self._post, always_call=True))

    def name_of(self, module: torch.nn.Module) -> str:
        """The module's path from the root (``blocks.0.attn.proj``), or its class name."""
        return self.names.get(id(module)) or f"<{type(module).__name__}>"

    @property
    def current(self) -> str:
        """The innermost module entered (``<outside>`` when none)."""
        return self.stack[-1] if self.stack else OUTSIDE

    def push(self, name: str) -> None:
        """Marks a module entered."""
        if self.active:
            self.stack.append(name)

    def push_backward(self, name: str) -> None:
        """Marks a module entered by the backward, below its submodules already entered.

        A module and its last submodule share an output, whose grad hooks fire outer last.
        """
        if not self.active:
            return
        i = len(self.stack)
        while i > 0 and _is_ancestor(name, self.stack[i - 1]):
            i -= 1
        self.stack.insert(i, name)

    def pop(self, name: str) -> None:
        """Marks a module left (its last entry)."""
        if not self.active:
            return
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] == name:
                del self.stack[i]
                return

    def _grad_hook(self, tensors: list[torch.Tensor], fn: Callable[[], None]) -> None:
        from torch.autograd.graph import register_multi_grad_hook

        grads = [t for t in tensors if t.requires_grad]
        if grads and torch.is_grad_enabled():
            self._grad_handles.append(register_multi_grad_hook(grads, lambda _g: fn(), mode="any"))

    def enter_root(self, module: torch.nn.Module, args: Any) -> None:
        """The root's own entry (its pre-hook ran before our global hooks existed)."""
        self._pre(module, args)

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self.name_of(module)
        self.push(name)
        self._grad_hook(list(tensors_of(args)), lambda: self.pop(name))

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.name_of(module)
        self.pop(name)
        self._grad_hook(list(tensors_of(output)), lambda: self.push_backward(name))

    def close(self) -> None:
        """Removes the hooks (grad hooks still pending become no-ops)."""
        self.active = False
        for h in self._handles + self._grad_handles:
            h.remove()
        self._handles.clear()
        self._grad_handles.clear()
        self.stack.clear()
