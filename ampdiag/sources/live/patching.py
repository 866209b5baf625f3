"""Temporary, observe-only patches of attributes, shared safely by every active diagnose() block.

Two blocks may patch the same function at once (nested blocks, one per thread, blocks exited
out of order through an ExitStack). A plain "save the attribute, set it back on exit" then
restores the wrong thing: the first block out puts back the original and drops the second
block's wrapper, and the second block out puts back the first one's wrapper, which keeps
calling into a finished diagnosis. So each patched attribute is one shared *slot*: the original
stays in it, one dispatcher is installed while any block patches it, and each block adds a
*layer* (its wrapper) that it removes on exit, in any order. The original is put back when the
last layer goes.

A layer observes only the thread that installed it: a block watches its own thread's training,
and another thread's calls go straight through to the next layer or the original.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_SLOTS: dict[tuple[int, str], _Slot] = {}


class _Layer:
    __slots__ = ("thread", "wrapper")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.wrapper: Callable[..., Any] | None = None


class _Slot:
    """One patched attribute: the original, the dispatcher installed over it, the layers."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name = owner, name
        # A class attribute may be inherited: restore by deleting ours rather than copying it.
        self.had_own = name in vars(owner) if isinstance(owner, type) else True
        # vars() keeps a staticmethod/classmethod wrapper intact for the restore.
        self.raw = (
            vars(owner)[name] if isinstance(owner, type) and self.had_own else getattr(owner, name)
        )
        self.original: Callable[..., Any] = getattr(owner, name)
        # Replaced, never mutated in place: a call in flight reads a consistent list.
        self.layers: tuple[_Layer, ...] = ()
        slot = self

        def dispatcher(*args: Any, **kwargs: Any) -> Any:
            layers = slot.layers
            if len(layers) == 1:  # one block (the usual case): no search through the layers
                layer = layers[0]
                if layer.thread == threading.get_ident() and layer.wrapper is not None:
                    return layer.wrapper(*args, **kwargs)
                return slot.original(*args, **kwargs)
            return slot.call_below(None, args, kwargs)

        _copy_identity(dispatcher, self.original)
        self.dispatcher = dispatcher

    def call_below(self, layer: _Layer | None, args: Any, kwargs: Any) -> Any:
        """Calls the next layer of this thread under ``layer`` (None: the top), or the original."""
        layers = self.layers
        end = len(layers)
        if layer is not None:
            end = layers.index(layer) if layer in layers else 0  # by identity (no __eq__)
        me = threading.get_ident()
        for i in range(end - 1, -1, -1):
            below = layers[i]
            if below.thread == me and below.wrapper is not None:
                return below.wrapper(*args, **kwargs)
        return self.original(*args, **kwargs)

    def install(self) -> None:
        setattr(self.owner, self.name, self.dispatcher)

    def uninstall(self) -> None:
        # Someone replaced our dispatcher meanwhile: leave theirs (ours passes through).
        if _current(self.owner, self.name) is not self.dispatcher:
            return
        if self.had_own:
            setattr(self.owner, self.name, self.raw)
        else:
            delattr(self.owner, self.name)


def _current(owner: object, name: str) -> Any:
    if isinstance(owner, type):
        return vars(owner).get(name)
    return getattr(owner, name, None)


def _copy_identity(fn: Callable[..., Any], original: Callable[..., Any]) -> None:
    for attr in ("__doc__", "__name__", "__qualname__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(fn, attr, getattr(original, attr))
    fn.__wrapped__ = original  # type: ignore[attr-defined]


class Patches:
    """One block's patches: layers added over shared slots, removed by `restore()`.

    Each wrapper must call the ``original`` it is given and return what it returns: ampdiag
    observes, it never changes what the user's code computes.
    """

    def __init__(self) -> None:
        self._mine: list[tuple[_Slot, _Layer]] = []

    def wrap(self, owner: object, name: str, make: Callable[[Any], Any]) -> None:
        """Replaces ``owner.name`` by ``make(original)`` for calls from this thread."""
        me = threading.get_ident()
        layer = _Layer(me)
        with _LOCK:
            key = (id(owner), name)
            slot = _SLOTS.get(key)
            if slot is None:
                slot = _SLOTS[key] = _Slot(owner, name)
                slot.install()
            # Placed now (no wrapper yet: calls pass through), so that what is below is known.
            below_mine = any(item.thread == me for item in slot.layers)
            slot.layers = (*slot.layers, layer)
        self._mine.append((slot, layer))
        if not below_mine:
            # Nothing of this thread below, now or later (layers only go on top): the
            # original itself, one frame fewer on every call.
            layer.wrapper = make(slot.original)
            return

        def original(*args: Any, **kwargs: Any) -> Any:
            return slot.call_below(layer, args, kwargs)

        _copy_identity(original, slot.original)
        layer.wrapper = make(original)

    def restore(self) -> None:
        """Removes this block's layers (the original returns with the last one). Safe twice."""
        with _LOCK:
            while self._mine:
                slot, layer = self._mine.pop()
                slot.layers = tuple(item for item in slot.layers if item is not layer)
                if not slot.layers and _SLOTS.get((id(slot.owner), slot.name)) is slot:
                    del _SLOTS[(id(slot.owner), slot.name)]
                    slot.uninstall()
