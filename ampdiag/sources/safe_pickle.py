"""Loading pickles that must hold plain data only (memory snapshots), without running code.

A pickle can name any importable callable (``os.system`` through ``__reduce__``) and the
standard unpickler calls it. `load_plain` admits only what the pickle opcodes build by
themselves: dict, list, tuple, set, str, bytes, int, float, bool and None. Any reference to a
global (a class or a function) or a persistent id is refused before anything is called. And
the input is bounded: only regular files, at most `MAX_BYTES` read, at most `MAX_OBJECTS`
containers nested at most `MAX_DEPTH` deep.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
from pathlib import Path
from typing import Any

from ampdiag.errors import InputError

MAX_BYTES = 1024**3
#: Most containers (dicts, lists, tuples, sets) a snapshot may hold, each counted once.
MAX_OBJECTS = 50_000_000
#: Deepest nesting accepted (a CUDA snapshot nests about 6 levels).
MAX_DEPTH = 64


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it references {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it uses a persistent id")


def loads_plain(data: bytes) -> Any:
    """Unpickles bytes that may hold only plain containers and scalars, then checks its shape.

    Raises:
        InputError: The pickle references code (or any global), is not a valid pickle, or
            holds more than `MAX_OBJECTS` containers or nests deeper than `MAX_DEPTH`.
    """
    try:
        value = _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"refusing to load the pickle: {exc}; only plain data (dicts, lists, numbers, "
            "strings) is accepted"
        ) from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise InputError(f"not a readable pickle: {type(exc).__name__}: {exc}") from None
    except (MemoryError, RecursionError) as exc:
        raise InputError(f"the pickle is too large to load ({type(exc).__name__})") from None
    check_bounded(value)
    return value


def check_bounded(value: Any) -> None:
    """Refuses data nested deeper than `MAX_DEPTH` or with more than `MAX_OBJECTS` containers.

    Walks iteratively (no recursion to exhaust) and visits each container once, however many
    times it is referenced: a pickle's memo can make a 1 KB file a graph whose tree form has
    2^40 nodes, which is why readers of the result must never ``str()`` or walk it as a tree.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple, set, frozenset)) or id(item) in seen:
            continue
        if depth >= MAX_DEPTH:
            raise InputError(f"refusing the pickle: nested deeper than {MAX_DEPTH} levels")
        seen.add(id(item))
        if len(seen) > MAX_OBJECTS:
            raise InputError(f"refusing the pickle: more than {MAX_OBJECTS} containers")
        children = (*item.keys(), *item.values()) if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)


def load_plain(path: str | Path) -> Any:
    """Reads and unpickles a regular file with `loads_plain` (the file's name is in any error).

    Only a regular file is read (a FIFO, a device or a symlink to one is refused before a byte
    is read), and at most `MAX_BYTES` of it, counted as it is read, not trusted from ``stat``.
    """
    p = Path(path)
    data = read_bounded(p, MAX_BYTES)
    try:
        return loads_plain(data)
    except InputError as exc:
        raise InputError(f"{p.name}: {exc}") from None


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else InputError."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{str(path)!r} is not a regular file")
        if info.st_size > limit:
            raise InputError(f"{str(path)!r} is larger than {limit} bytes")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 24, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # the file grew, or stat lied (a special file system)
                raise InputError(f"{str(path)!r} is larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
