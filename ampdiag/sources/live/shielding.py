"""An exit that nothing can interrupt half-way: Ctrl-C deferred, the user's exception read safely.

``diagnose()``'s exit removes hooks from the user's model and patches from torch. If a second
Ctrl-C (a ``KeyboardInterrupt`` raised at any bytecode) lands in the middle, a forward hook
stays on the model, holding its inputs, and torch keeps calling into a finished diagnosis. So
the removal runs with SIGINT deferred: the signal is noted and raised right after (or handed to
the user's own handler). And the user's exception is described without trusting it: its
``__str__`` may raise, its message may be huge.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

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
