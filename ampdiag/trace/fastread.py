"""The fast path of the trace reader: chunks of whole events, decoded by compiled code.

The decompressed file (gzip through ISA-L's ``isal`` when installed) is read in chunks of
bytes. Each chunk is cut after the last complete event (a ``}`` followed by ``,`` and ``{``)
and the run of events before the cut is handed at once to the compiled scanner
(``ampdiag/trace/_kscan.c``, built when the package is installed with a C compiler), which
appends the fields the analysis needs to compact columns; where it is not built, or refuses
a part (an escaped category, say), msgspec decodes the part instead
(:mod:`ampdiag.trace.msgspec_events`), with the same records. Memory stays bounded by the
chunk size plus the columns. A large file is read by several processes at once
(:mod:`ampdiag.trace.parallel`).

This path reads only well-formed traces in the usual shape, and gives up (:class:`Fallback`) at
the first thing it does not expect: a cut that turns out not to be between events, a missing or
mistyped field, a non-finite time, a negative duration, bytes that are not UTF-8, an unknown
phase, odd top-level structure. The caller then reads the file again with the standard-library
reader, which handles (or reports) everything; so the two paths always agree, and bad input
gets the same one-line errors and warnings whichever path met it first.

Known difference: an integer literal of more than 4300 digits in a field the analysis does not
read stops the standard-library decoder ("cannot decode a value"); here it is skipped.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
from pathlib import Path
from typing import IO, Any

from ampdiag.trace.builder import ColumnBuilder, scanner_groups
from ampdiag.trace.reader import Fallback, RankTrace, _meta_value

CHUNK_BYTES = 2 << 20
ENV_SCANNER = "AMPDIAG_TRACE_SCANNER"
MAX_HEAD_BYTES = 64 << 20

_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')


def _open_binary(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic != b"\x1f\x8b":
        return open(path, "rb")
    try:
        # In this thread: a decompressing thread of its own (igzip_threaded) was measured
        # slower here, its hand-offs contending with the decoding for the interpreter's lock.
        from isal import igzip

        opened: Any = igzip.open(path, "rb")  # type: ignore[no-untyped-call]
    except ImportError:
        opened = gzip.open(path, "rb")  # noqa: SIM115
    return opened  # type: ignore[no-any-return]


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


class _ScanRefused(Exception):
    """The compiled scanner met what it does not handle: read the part again with msgspec."""


def _take(build: ColumnBuilder, run: Any) -> None:
    """Appends a run of events (a JSON array): with the compiled scanner, else msgspec."""
    if build.scanner is None:
        from ampdiag.trace.msgspec_events import decode_list

        build.add(decode_list(run))
        return
    try:
        build.scanner.feed(run)
    except ValueError as exc:
        raise _ScanRefused(str(exc)) from None


def _take_run(build: ColumnBuilder, buf: bytearray, lo: int, hi: int) -> None:
    """Appends buf[lo + 1 : hi - 1], a run of whole events (without copying it)."""
    saved = buf[lo], buf[hi - 1]
    buf[lo], buf[hi - 1] = 0x5B, 0x5D  # '[' and ']' around the run, restored below
    try:
        with memoryview(buf) as mv:
            _take(build, mv[lo:hi])
    finally:
        buf[lo], buf[hi - 1] = saved


def _top_level(text: str, out: RankTrace) -> None:
    """Keys of the top-level object outside traceEvents, as the general reader keeps them."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        raise Fallback("top level") from None
    if not isinstance(obj, dict) or "traceEvents" in obj:
        raise Fallback("top level")
    for key, val in obj.items():
        _meta_value(out, key, val)


def read_fast(path: Path, index: int = 0) -> RankTrace:
    """Reads one trace file with the fast path (see :func:`ampdiag.trace.parallel.read_fast`).

    Raises:
        Fallback: Anything this path does not handle; read the file with the general reader.
    """
    from ampdiag.trace import parallel

    return parallel.read_fast(path, index)


def read_part(path: Path, lo: int = 0, hi: int | None = None) -> tuple[RankTrace, ColumnBuilder]:
    """Decodes the events of one part of a file (all of it by default), unfinished.

    Args:
        path: The trace file.
        lo: Where the part starts in the decompressed bytes (see `_read`).
        hi: Where the next part starts (None: the part runs to the end of the file).

    Returns:
        (the RankTrace with the top-level keys read, the builder holding the part's columns).

    Raises:
        Fallback: Anything this path does not handle.
    """
    scanner = new_scanner()
    if scanner is not None:
        try:
            return _read_part(path, lo, hi, scanner)
        except _ScanRefused:
            pass  # e.g. an escaped category: msgspec reads the part
    return _read_part(path, lo, hi, None)


def _read_part(
    path: Path, lo: int, hi: int | None, scanner: Any
) -> tuple[RankTrace, ColumnBuilder]:
    out = RankTrace(path=path)
    if scanner is None:
        from ampdiag.trace.msgspec_events import Complete  # ImportError: no msgspec

        build = ColumnBuilder(Complete, None)
    else:
        build = ColumnBuilder(None, scanner)
    try:
        fh = _open_binary(path)
    except OSError:
        raise Fallback("open") from None
    try:
        with fh:
            _read(fh, out, build, lo, hi)
    except (Fallback, _ScanRefused):
        raise
    except Exception as exc:  # truncated gzip, I/O errors...: the general reader reports them
        raise Fallback(repr(exc)) from None
    return out, build


def new_scanner() -> Any:
    """The compiled scanner (``ampdiag.trace._kscan``), or None: msgspec decodes then.

    None where the extension is not built, or ``AMPDIAG_TRACE_SCANNER=0`` turns it off; the
    records are the same either way.
    """
    if os.environ.get(ENV_SCANNER, "").strip() == "0":
        return None
    try:
        from ampdiag.trace import _kscan  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _kscan.Scanner(scanner_groups())


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


def _read(
    fh: IO[bytes], out: RankTrace, build: ColumnBuilder, lo: int = 0, hi: int | None = None
) -> None:
    """Decodes the events of the part ``[lo, hi)`` of the decompressed bytes into ``build``.

    A part starts at the first event after the first ``}`` at or after its offset (and after
    the ``[`` of traceEvents) that ends an event (is followed by ``,`` and ``{``); the part
    before it ends there. Every process finds that place alike from the same bytes, so the
    parts of one file, read by different processes, hold every event exactly once. The part
    that reaches the end of traceEvents also reads the rest of the top-level object.
    """
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
        _top_level(h[:-1] + "}", out)
    elif h != "{":
        raise Fallback("head")
    pos = m.end()  # buf[pos - 1] is the '[' of traceEvents
    base, events_at = 0, pos  # offsets in the file: of buf[0], and where the events begin
    if lo > 0:  # skip to the first event of this part
        while True:
            x = max(lo, events_at) - base
            s = _BOUNDARY.search(buf, max(x, pos), n)
            if s:
                if hi is not None and base + s.start() >= max(hi, events_at):
                    return  # the next part starts at the same event: this one is empty
                pos = s.end() - 1  # its '{'
                break
            if n < len(buf):
                return  # no event starts in this part
            drop = min(x, n)  # a boundary that begins at or after x may straddle the refill
            keep = n - drop
            buf[:keep] = buf[drop:n]
            base += drop
            if keep > len(buf) // 2:
                buf.extend(bytes(len(buf)))
            pos, n = 0, _fill(fh, buf, keep, utf8)
    while True:
        if hi is not None and max(hi, events_at) - base < n:  # does the next part start here?
            s = _BOUNDARY.search(buf, max(max(hi, events_at) - base, pos), n)
            if s:
                _take_run(build, buf, pos - 1, s.start() + 2)
                return
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
        base += pos - 1
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
        _top_level("{" + rest[1:], out)
    elif rest != "}":
        raise Fallback("after traceEvents")
