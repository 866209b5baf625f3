"""torch's global module and optimizer hooks, shared by every active diagnose() block.

torch keeps its global hooks in plain dicts that it iterates on every forward and optimizer
step, in whatever thread runs them. A block in one thread that adds or removes a hook while
another thread iterates the same dict makes that thread's training fail ("OrderedDict mutated
during iteration"). So ampdiag registers one hook of each kind with torch, the first time a
block needs it, and keeps it until no block is left; blocks add and remove their callbacks in
ampdiag's own list (a tuple replaced under a lock, safe to iterate from any thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

MODULE_PRE, MODULE_POST, OPTIMIZER_PRE, OPTIMIZER_POST = (
    "module_pre",
    "module_post",
    "optimizer_pre",
    "optimizer_post",
)

_LOCK = threading.Lock()
_blocks = 0


class _Shared:
    """One hook registered with torch, calling every block's callbacks of its kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.callbacks: tuple[Callable[..., Any], ...] = ()
        self.handle: Any = None

    def call(self, *args: Any) -> None:
        for callback in self.callbacks:
            callback(*args)

    def call_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """Optimizer pre-hooks may hand ``step`` other arguments (a wrapped closure): chained."""
        changed = None
        for callback in self.callbacks:
            result = callback(optimizer, args, kwargs)
            if result is not None:
                args, kwargs = changed = result
        return changed

    def install(self) -> None:
        if self.handle is not None:
            return
        if self.kind == MODULE_PRE:
            self.handle = nn_module.register_module_forward_pre_hook(lambda m, a: self.call(m, a))
        elif self.kind == MODULE_POST:
            self.handle = nn_module.register_module_forward_hook(
                lambda m, a, o: self.call(m, a, o), always_call=True
            )
        elif self.kind == OPTIMIZER_PRE:
            self.handle = optim_module.register_optimizer_step_pre_hook(self.call_step_pre)
        else:
            self.handle = optim_module.register_optimizer_step_post_hook(
                lambda o, a, k: self.call(o)
            )

    def uninstall(self) -> None:
        if self.handle is not None and not self.callbacks:
            self.handle.remove()
            self.handle = None


_SHARED = {kind: _Shared(kind) for kind in (MODULE_PRE, MODULE_POST, OPTIMIZER_PRE, OPTIMIZER_POST)}


class Handle:
    """Removes one callback (safe to call twice)."""

    def __init__(self, shared: _Shared, callback: Callable[..., Any]) -> None:
        self._shared: _Shared | None = shared
        self._callback = callback

    def remove(self) -> None:
        """Removes the callback; torch's hook too when no other block may be iterating it."""
        with _LOCK:
            shared, self._shared = self._shared, None
            if shared is None:
                return
            shared.callbacks = tuple(c for c in shared.callbacks if c is not self._callback)
            if _blocks <= 1:  # no other block's thread may be iterating torch's dict
                shared.uninstall()


def add(kind: str, callback: Callable[..., Any]) -> Handle:
    """Adds a callback of one kind (`MODULE_PRE`, `MODULE_POST`, `OPTIMIZER_PRE`, ...).

    Module hooks get (module, args[, output]); optimizer pre-hooks get (optimizer, args,
    kwargs) and may return new (args, kwargs); post-hooks get (optimizer).
    """
    with _LOCK:
        shared = _SHARED[kind]
        shared.callbacks = (*shared.callbacks, callback)
        shared.install()
        return Handle(shared, callback)


def block_started() -> None:
    """Counts a diagnose() block in (call before it adds callbacks)."""
    global _blocks
    with _LOCK:
        _blocks += 1


def block_ended() -> None:
    """Counts a block out (after it removed its callbacks); the last one removes torch's hooks."""
    global _blocks
    with _LOCK:
        _blocks = max(0, _blocks - 1)
        if _blocks == 0:
            for shared in _SHARED.values():
                shared.uninstall()
