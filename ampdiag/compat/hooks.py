"""torch's global forward hook with keyword arguments, removed completely.

``torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)`` records the
flag in the private dict ``_global_forward_hooks_with_kwargs``, but the ``RemovableHandle`` it
returns lists only ``_global_forward_hooks_always_called`` as an extra dict, so
``handle.remove()`` leaves the flag behind (checked on torch 2.4-2.13; a torch bug, reproduced
in a few lines in docs/_incoming/green32.md). ampdiag promises to leave every global table as
found, so `register_global_forward_hook` returns a handle that also removes the flag.

Guard: the flag is removed only when torch's own ``remove`` left it there and the private dict
exists, so a torch that fixes the bug (or renames the dict) gets its plain ``remove``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.nn.modules import module as nn_module


class GlobalForwardHookHandle:
    """torch's handle, whose ``remove`` also drops the with-kwargs flag (safe to call twice)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.id: int = handle.id

    def remove(self) -> None:
        """Removes the hook and its flags (torch's remove leaves the with-kwargs one)."""
        self._handle.remove()
        flags = getattr(nn_module, "_global_forward_hooks_with_kwargs", None)
        if isinstance(flags, dict):
            flags.pop(self.id, None)


def register_global_forward_hook(
    hook: Callable[..., Any], *, with_kwargs: bool = False, always_call: bool = False
) -> GlobalForwardHookHandle:
    """``register_module_forward_hook``, with a handle that leaves no table entry behind."""
    handle = nn_module.register_module_forward_hook(
        hook, with_kwargs=with_kwargs, always_call=always_call
    )
    return GlobalForwardHookHandle(handle)


def any_global_module_hook() -> bool:
    """Whether any global module hook is registered (torch's private check, or its dicts)."""
    check = getattr(nn_module, "_has_any_global_hook", None)
    if callable(check):
        return bool(check())
    tables = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_hooks",
              "_global_backward_pre_hooks")  # fmt: skip
    return any(getattr(nn_module, name, None) for name in tables)
