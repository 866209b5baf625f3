"""Temporary, observe-only patches of attributes, undone in reverse order on exit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Patches:
    """A stack of attribute replacements that `restore()` undoes, last first.

    Each wrapper must call the original and return what it returns: ampdiag observes, it never
    changes what the user's code computes.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, Any, bool]] = []

    def wrap(self, owner: object, name: str, make: Callable[[Any], Any]) -> None:
        """Replaces ``owner.name`` by ``make(original)``."""
        # A class attribute may be inherited: restore by deleting ours rather than copying it.
        had_own = name in vars(owner) if isinstance(owner, type) else True
        # vars() keeps a staticmethod/classmethod wrapper intact for the restore.
        raw = vars(owner)[name] if isinstance(owner, type) and had_own else getattr(owner, name)
        setattr(owner, name, make(getattr(owner, name)))
        self._undo.append((owner, name, raw, had_own))

    def restore(self) -> None:
        """Undoes every patch, newest first. Safe to call twice."""
        while self._undo:
            owner, name, original, had_own = self._undo.pop()
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
