"""A block's exit: nothing interrupts it half-way, the user's exception is read safely.

And the process's warning filters are left as the block found them (`ImportFilters`).

``diagnose()``'s exit removes hooks from the user's model and patches from torch. If a second
Ctrl-C (a ``KeyboardInterrupt`` raised at any bytecode) lands in the middle, a forward hook
stays on the model, holding its inputs, and torch keeps calling into a finished diagnosis. So
the removal runs with SIGINT deferred: the signal is noted and raised right after (or handed to
the user's own handler). And the user's exception is described without trusting it: its
``__str__`` may raise, its message may be huge.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

from ampdiag.compat.warnings_cache import clear_warning_caches

MAX_MESSAGE = 2000
MAX_TRACEBACK = 4000


class Deferred:
    """What arrived while the exit was shielded: whether SIGINT came, and the user's handler."""

    def __init__(self) -> None:
        self.interrupted = False
        self.frame: FrameType | None = None
        self.handler: Any = None

    def deliver(self) -> None:
        """Acts on a deferred SIGINT as it would have acted: the user's handler, or Ctrl-C."""
        if not self.interrupted:
            return
        self.interrupted = False
        handler = self.handler
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, self.frame)
        else:
            raise KeyboardInterrupt


@contextmanager
def sigint_deferred() -> Iterator[Deferred]:
    """Defers SIGINT over the block (main thread only: signals arrive there), then restores.

    The caller delivers the deferred interrupt (``Deferred.deliver``) when its critical part is
    done. Where SIGINT is ignored or left to the OS (``SIG_IGN``, ``SIG_DFL``), nothing changes.
    """
    state = Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):
        yield state
        return
    if previous in (signal.SIG_IGN, signal.SIG_DFL, None):
        yield state
        return
    state.handler = previous

    def note(signum: int, frame: FrameType | None) -> None:
        state.interrupted = True
        state.frame = frame

    signal.signal(signal.SIGINT, note)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def _text(make: Any, limit: int) -> str:
    try:
        text = make()
        if not isinstance(text, str):
            text = object.__repr__(text)
    except BaseException as exc:  # the user's __str__ may raise anything
        try:
            return f"<the message could not be read: {type(exc).__name__}>"
        except BaseException:
            return "<the message could not be read>"
    if len(text) > limit:
        return f"{text[:limit]}... [{len(text) - limit} more characters]"
    return text


def describe_exception(exc: BaseException, tb: TracebackType | None) -> dict[str, str]:
    """``{type, message, traceback}`` of the user's exception, capped, never raising."""
    name = _text(lambda: type(exc).__qualname__, 200)
    message = _text(lambda: str(exc), MAX_MESSAGE)
    frames = _text(lambda: "".join(traceback.format_tb(tb, limit=-30)), 10 * MAX_TRACEBACK)
    text = f"Traceback (most recent call last):\n{frames}{name}: {message}"
    return {"type": name, "message": message, "traceback": text[-MAX_TRACEBACK:]}


class ImportFilters:
    """Removes the warning filters that modules first imported during the block added.

    torch imports sympy, numpy or tensorboard lazily, the first time a collector or renderer
    needs them, and some of those add a filter at import (sympy's ``once`` for its deprecation
    warnings). The user's process must keep the filters it had: a filter added during the block
    whose warning class comes from a module imported during the block is ampdiag's doing and is
    removed on exit; the user's own filters (on classes that existed before) stay.
    """

    def __init__(self) -> None:
        self._before = list(warnings.filters)
        self._modules = set(sys.modules)

    def remove_added(self) -> None:
        """Drops the filters added by imports since the block began (safe to call twice).

        In place, in the current list and in the lists that ``catch_warnings`` blocks still
        open in other threads saved: one such block (another thread training) restores its
        saved list on leaving, which would bring an import's filter back, and a
        ``catch_warnings`` of ours would restore the other thread's filters over its exit.
        """
        added = [f for f in warnings.filters if f not in self._before and self._from_new_module(f)]
        if not added:
            return
        current: list[Any] = warnings.filters  # type: ignore[assignment]
        for saved in [current, *_saved_filter_lists()]:
            saved[:] = [f for f in saved if f not in added]
        clear_warning_caches()

    def _from_new_module(self, entry: Any) -> bool:
        category = entry[2] if isinstance(entry, tuple) and len(entry) > 2 else None
        module = getattr(category, "__module__", "builtins")
        return module not in self._modules


def hide_warning(message: str, category: type[Warning]) -> Any:
    """Adds an ``ignore`` filter of ampdiag's, first; returns it (None: an equal one is there).

    For a warning that ampdiag's own doing makes the user's code raise; `unhide_warning`
    removes exactly that entry, wherever the filters list has been copied meanwhile.
    """
    entry = ("ignore", re.compile(message, re.I), category, None, 0)
    if entry in warnings.filters:  # the user's own (re.compile caches: equal patterns)
        return None
    current: list[Any] = warnings.filters  # type: ignore[assignment]
    current.insert(0, entry)
    clear_warning_caches()
    return entry


def unhide_warning(entry: Any) -> None:
    """Removes a `hide_warning` filter by identity, also from lists ``catch_warnings`` saved."""
    current: list[Any] = warnings.filters  # type: ignore[assignment]
    for saved in [current, *_saved_filter_lists()]:
        if any(f is entry for f in saved):
            saved[:] = [f for f in saved if f is not entry]
    clear_warning_caches()


def _saved_filter_lists() -> list[list[Any]]:
    """The filter lists saved by the ``warnings.catch_warnings`` blocks open now (any thread).

    None to look for while this thread runs alone: a block of this thread opened during the
    block has closed (the ``with`` statements nest), and one opened before it saved the filters
    from before the imports. The search walks every object the garbage collector tracks
    (``gc.get_referrers``): 25 ms of a nanoGPT-style exit, more in a larger program.
    """
    import gc

    if threading.active_count() <= 1:
        return []
    out = []
    for obj in gc.get_referrers(warnings.catch_warnings):
        if isinstance(obj, warnings.catch_warnings) and getattr(obj, "_entered", False):
            saved = getattr(obj, "_filters", None)
            if isinstance(saved, list) and saved is not warnings.filters:
                out.append(saved)
    return out
