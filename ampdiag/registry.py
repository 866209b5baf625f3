"""One way to plug in: a table of modules, each of which registers its entries when imported.

Rules, advisors, collectors and report sections are each a `Registry`: the package's
``__init__`` holds the table (its modules, in order), and a module adds its entries with the
registry's ``register`` (a decorator). So a new rule, advisor, collector or section is one new
file plus one line in its table; the renderers' table (`ampdiag.render.registry.RENDERERS`)
is the same idea for classes that import nothing until they write. The modules are imported
on first use, so listing a collector (which imports torch) costs ``ampdiag report`` nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[T]):
    """The entries the modules of one package register, in the table's order.

    Args:
        package: The package whose modules are listed (``ampdiag.analysis.rules``).
        modules: Its modules, in the order their entries run or show; the one line a new
            module adds.
        ids: What an entry declares as its ids (unique across the registry), or None.
    """

    def __init__(
        self,
        package: str,
        modules: Sequence[str],
        ids: Callable[[T], Sequence[str]] | None = None,
    ) -> None:
        self.package = package
        self.modules = tuple(modules)
        self._ids = ids
        self._entries: list[tuple[str, T]] = []

    def add(self, entry: T, module: str) -> T:
        """Adds ``entry``, registered by ``module`` (a module's name); checks its ids."""
        if self._ids is not None:
            taken = {i for _, e in self._entries for i in self._ids(e)}
            clash = taken.intersection(self._ids(entry))
            if clash:
                raise ValueError(f"ids {sorted(clash)} are already registered in {self.package}")
        self._entries.append((module, entry))
        return entry

    def register(self, entry: T) -> T:
        """Registers a class (or function) by its own module: ``@COLLECTORS.register``."""
        return self.add(entry, str(getattr(entry, "__module__", "")))

    def entries(self) -> list[T]:
        """Every entry, in table order (importing the listed modules on first use)."""
        for name in self.modules:
            importlib.import_module(f"{self.package}.{name}")
        order = {f"{self.package}.{name}": i for i, name in enumerate(self.modules)}
        ranked = sorted(enumerate(self._entries), key=lambda p: (order.get(p[1][0], 1 << 30), p[0]))
        return [entry for _, (_, entry) in ranked]


@dataclass(frozen=True)
class Registered(Generic[F]):
    """A registered function: a rule (`ampdiag.analysis.registry.Rule`) or an advisor.

    Attributes:
        ids: The finding ids it may emit (an advisor may re-emit a rule's).
        func: The function; it reads its inputs and never modifies them.
        doc: Its docstring (what it detects or recommends, from which evidence, thresholds).
    """

    ids: tuple[str, ...]
    func: F
    doc: str


def registering(registry: Registry[Registered[F]], ids: Sequence[str]) -> Callable[[F], F]:
    """The decorator that registers a function with ``ids`` in ``registry`` (`rule`, `advisor`)."""

    def register(func: F) -> F:
        doc = (func.__doc__ or "").strip()
        registry.add(Registered(tuple(ids), func, doc), func.__module__)
        return func

    return register
