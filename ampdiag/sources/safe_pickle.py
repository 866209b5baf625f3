"""Loading pickles that must hold plain data only (memory snapshots), without running code.

A pickle can name any importable callable (``os.system`` through ``__reduce__``) and the
standard unpickler calls it. `load_plain` admits only what the pickle opcodes build by
themselves: dict, list, tuple, set, str, bytes, int, float, bool and None. Any reference to a
global (a class or a function) or a persistent id is refused before anything is called.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from ampdiag.errors import InputError

MAX_BYTES = 2 * 1024**3


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it references {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it uses a persistent id")


def loads_plain(data: bytes) -> Any:
    """Unpickles bytes that may hold only plain containers and scalars.

    Raises:
        InputError: The pickle references code (or any global) or is not a valid pickle.
    """
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"refusing to load the pickle: {exc}; only plain data (dicts, lists, numbers, "
            "strings) is accepted"
        ) from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise InputError(f"not a readable pickle: {type(exc).__name__}: {exc}") from None


def load_plain(path: str | Path) -> Any:
    """Reads and unpickles a file with `loads_plain` (the file's name is in any error)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"{str(p)!r} is larger than {MAX_BYTES} bytes")
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from None
    try:
        return loads_plain(data)
    except InputError as exc:
        raise InputError(f"{p.name}: {exc}") from None
