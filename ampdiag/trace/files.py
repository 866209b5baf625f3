"""Opening a trace file: gzip told by its magic bytes (not the name), ISA-L's gunzip if present."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import IO, Any

GZIP_MAGIC = b"\x1f\x8b"

READ_ERRORS: tuple[type[Exception], ...] = (EOFError, zlib.error, gzip.BadGzipFile, OSError)
"""What reading a (possibly truncated or corrupt) gzip stream raises."""

_gunzip: Any = gzip
try:  # ISA-L's gunzip: faster than zlib's (a dependency, but a platform may lack a wheel)
    from isal import igzip, isal_zlib

    _gunzip = igzip
    READ_ERRORS += (isal_zlib.error,)  # type: ignore[operator]
except ImportError:  # pragma: no cover
    pass


def open_binary(path: Path) -> IO[bytes]:
    """The decompressed bytes of a ``.json`` or ``.json.gz`` trace (gzip sniffed, not named).

    Raises:
        OSError: The file cannot be opened.
    """
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic != GZIP_MAGIC:
        return open(path, "rb")
    # In this thread: a decompressing thread of its own (igzip_threaded) was measured slower,
    # its hand-offs contending with the decoding for the interpreter's lock.
    return _gunzip.open(path, "rb")  # type: ignore[no-any-return]
