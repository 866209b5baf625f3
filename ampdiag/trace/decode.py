"""The reader's decoder: runs of whole events cut from the bytes and decoded by msgspec.

The decompressed file (:func:`ampdiag.trace.files.open_binary`) is read in chunks of bytes.
Each chunk is cut after the last complete event (a ``}`` followed by ``,`` and ``{``) and the
run of events before the cut is decoded at once by msgspec into the structs of
:mod:`ampdiag.trace.builder`, which keeps their columns. Memory stays bounded by the chunk size
plus the columns.

An odd event (a negative duration, a time that is a string, a missing field, an unknown phase)
makes msgspec refuse its run; that run alone is decoded again by the standard library and its
events repaired or skipped one by one (:func:`ampdiag.trace.builder.event_from_dict`), counted
in ``RankTrace.skipped``; the rest of the file stays here. What this path cannot cut safely
(a cut that turns out not to be between events, bytes that are not UTF-8, odd top-level
structure, an unreadable stream) raises :class:`~ampdiag.trace.records.Fallback`: the caller
reads the whole file with the lenient reader (:mod:`ampdiag.trace.lenient`), which reports bad
input in one line.
"""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import IO, Any

import msgspec

from ampdiag.trace.builder import EVENTS_DECODER, ColumnBuilder
from ampdiag.trace.files import READ_ERRORS, open_binary
from ampdiag.trace.records import Fallback, RankTrace, keep_meta

CHUNK_BYTES = 1 << 19
MAX_HEAD_BYTES = 64 << 20

_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')


class _Utf8:
    """Checks that the bytes read are UTF-8, decoding only buffers that are not plain ASCII."""

    def __init__(self) -> None:
        self.dec = codecs.getincrementaldecoder("utf-8")()

    def check(self, buf: bytearray, new: memoryview, final: bool = False) -> None:
        """Checks the newly read bytes ``new`` (in ``buf``, which they end)."""
        if not final and not self.dec.getstate()[0] and buf.isascii():
            return
        try:
            self.dec.decode(new.tobytes(), final=final)
        except UnicodeDecodeError:
            raise Fallback("not UTF-8") from None


def _take(build: ColumnBuilder, run: Any) -> None:
    """Decodes a run of events (a JSON array): by msgspec, else by the standard library."""
    try:
        build.add(EVENTS_DECODER.decode(run))
        return
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass  # an odd event in this run: repaired or skipped one by one below
    try:
        events = json.loads(bytes(run))
    except (ValueError, RecursionError):  # not a run of whole events after all
        raise Fallback("a run that is not JSON") from None
    build.add_dicts(events)


def _take_run(build: ColumnBuilder, buf: bytearray, lo: int, hi: int) -> None:
    """Decodes buf[lo + 1 : hi - 1], a run of whole events (without copying it)."""
    saved = buf[lo], buf[hi - 1]
    buf[lo], buf[hi - 1] = 0x5B, 0x5D  # '[' and ']' around the run, restored below
    try:
        with memoryview(buf) as mv:
            _take(build, mv[lo:hi])
    finally:
        buf[lo], buf[hi - 1] = saved


def _top_level(text: str, meta: dict[str, Any]) -> None:
    """Keys of the top-level object outside traceEvents, as the lenient reader keeps them."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise Fallback("top level") from None
    if not isinstance(obj, dict) or "traceEvents" in obj:
        raise Fallback("top level")
    for key, val in obj.items():
        keep_meta(meta, key, val)


def read_fast(path: Path, index: int = 0) -> RankTrace:
    """Reads one trace file with the decoder (see the module's docstring).

    Args:
        path: The trace file.
        index: The file's position among the ranks (the rank of last resort).

    Raises:
        Fallback: Anything this path does not cut safely; read the file with the lenient reader.
    """
    build = ColumnBuilder()
    meta: dict[str, Any] = {}
    try:
        with open_binary(path) as fh:
            _read(fh, meta, build)
    except READ_ERRORS as exc:  # truncated gzip, I/O errors...: the lenient reader reports them
        raise Fallback(repr(exc)) from None
    return build.finish(path, meta, index, "fast")


def _fill(fh: IO[bytes], buf: bytearray, start: int, utf8: _Utf8) -> int:
    """Reads into buf[start:] until it is full or the file ends; returns the bytes now held."""
    n = start
    with memoryview(buf) as mv:
        while n < len(buf):
            got = fh.readinto(mv[n:])  # type: ignore[attr-defined]
            if not got:
                break
            n += got
        utf8.check(buf if n == len(buf) else buf[:n], mv[start:n])
    return n


def _read(fh: IO[bytes], meta: dict[str, Any], build: ColumnBuilder) -> None:
    """Decodes the events of the file into ``build``, its other top-level keys into ``meta``."""
    utf8 = _Utf8()
    buf = bytearray(CHUNK_BYTES)
    n = _fill(fh, buf, 0, utf8)
    while True:
        m = _KEY.search(buf, 0, n)
        if m:
            break
        if n < len(buf) or n > MAX_HEAD_BYTES:
            raise Fallback("no traceEvents key found")
        buf.extend(bytes(len(buf)))
        n = _fill(fh, buf, n, utf8)
    h = bytes(buf[: m.start()]).decode("utf-8").strip()
    if h.endswith(","):
        _top_level(h[:-1] + "}", meta)
    elif h != "{":
        raise Fallback("head")
    pos = m.end()  # buf[pos - 1] is the '[' of traceEvents
    while True:
        # the run of events up to the last boundary between two events in the buffer
        cut = buf.rfind(b"}", pos, n)
        while cut >= pos:
            b = _BOUNDARY.match(buf, cut, n)
            if b:
                _take_run(build, buf, pos - 1, cut + 2)
                pos = b.end() - 1
                break
            cut = buf.rfind(b"}", pos, cut)
        if n < len(buf):  # the end of the file
            break
        # keep buf[pos - 1:], then read more after it
        keep = n - (pos - 1)
        buf[:keep] = buf[pos - 1 : n]
        if keep > len(buf) // 2:  # one event larger than half the buffer: make room
            buf.extend(bytes(len(buf)))
        pos, n = 1, _fill(fh, buf, keep, utf8)
    with memoryview(buf) as mv:
        utf8.check(buf, mv[n:n], final=True)
    # the last event(s), the end of traceEvents and the rest of the top-level object
    tail_bytes = bytes(buf[pos:n])
    tail = tail_bytes.decode("utf-8")
    try:
        _, end = json.JSONDecoder().raw_decode("[" + tail)
    except (ValueError, RecursionError):
        raise Fallback("tail") from None
    close = len(tail[: end - 2].encode("utf-8"))  # where the ']' of traceEvents is
    _take(build, b"[" + tail_bytes[:close] + b"]")
    rest = tail[end - 1 :].strip()
    if rest.startswith(","):
        _top_level("{" + rest[1:], meta)
    elif rest != "}":
        raise Fallback("after traceEvents")
