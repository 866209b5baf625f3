"""The reader's lenient path: the standard library's JSON stream, any layout, one-line errors.

The file is streamed in chunks of text and decoded one event at a time with
``json.JSONDecoder.raw_decode``; each event goes through the same rules and the same column
builder as the decoder's (:func:`ampdiag.trace.builder.event_from_dict`). It reads any valid
JSON, whatever its layout and wherever a chunk ends, and what is not a Kineto trace raises
:class:`~ampdiag.errors.InputError` with one line saying why. The decoder
(:mod:`ampdiag.trace.decode`) hands a file over here only where it cannot cut it safely.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import IO, Any

from ampdiag.errors import InputError
from ampdiag.trace.builder import ColumnBuilder
from ampdiag.trace.files import READ_ERRORS, open_binary
from ampdiag.trace.records import RankTrace, keep_meta

CHUNK_CHARS = 4 << 20
BATCH = 4096
"""Events handed to the column builder at a time."""
NEAR_END = 16
"""A decoding error this close to the end of the buffer may be a token cut by it (``tr|ue``,
``1e|5``, ``\\ud83d|\\ude00``): read more and decode again before calling the JSON invalid."""

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Stream:
    """A text buffer over the file that grows by chunks (everything before ``pos`` is dropped)."""

    def __init__(self, fh: IO[str], label: str) -> None:
        self.fh = fh
        self.label = label
        self.buf = ""
        self.pos = 0
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.fh.read(CHUNK_CHARS)
        except UnicodeDecodeError as exc:
            raise InputError(f"cannot read trace {self.label}: not UTF-8 text ({exc})") from None
        except READ_ERRORS as exc:
            raise InputError(
                f"cannot read trace {self.label}: truncated or corrupt ({exc})"
            ) from None
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, char: str, what: str) -> None:
        got = self.peek()
        if got != char:
            shown = repr(got) if got else "the end of the file"
            raise InputError(f"{self.label} is not valid JSON: expected {what}, found {shown}")
        self.pos += 1

    def value(self) -> Any:
        """Decodes the JSON value at the current position."""
        self.peek()
        while True:
            try:
                val, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                near_end = exc.pos >= len(self.buf) - NEAR_END or exc.msg.startswith("Unterminated")
                if near_end and self.fill():
                    continue
                raise InputError(
                    f"{self.label} is not valid JSON: {exc.msg} (character {exc.pos} of a chunk)"
                    + ("; the file looks truncated" if self.eof and near_end else "")
                ) from None
            except (ValueError, RecursionError) as exc:
                raise InputError(f"{self.label}: cannot decode a value: {exc}") from None
            # A number or literal cut by the end of the buffer decodes "successfully" (``1`` of
            # ``12``, ``1`` of ``1e5``): decode again with more text before trusting it.
            if len(self.buf) - end <= NEAR_END and self.fill():
                continue
            self.pos = end
            return val


def _read_events(stream: _Stream, build: ColumnBuilder) -> None:
    """Reads the traceEvents array (the '[' already consumed)."""
    batch: list[Any] = []
    first = True
    while True:
        char = stream.peek()
        if char == "]":
            stream.pos += 1
            break
        if not first:
            stream.expect(",", "',' or ']' in traceEvents")
        first = False
        if stream.peek() == "":
            raise InputError(f"{stream.label} ends inside traceEvents: the file looks truncated")
        batch.append(stream.value())
        if len(batch) >= BATCH:
            build.add_dicts(batch)
            batch = []
    build.add_dicts(batch)


def read_lenient(path: Path, index: int = 0) -> RankTrace:
    """Reads one trace file with the standard-library stream (see the module's docstring).

    Raises:
        InputError: Unreadable, not JSON, truncated, or not a Kineto trace.
    """
    label = repr(str(path))
    build = ColumnBuilder()
    meta: dict[str, Any] = {}
    seen_events = False
    try:
        fh = io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="strict")
    except OSError as exc:
        raise InputError(f"cannot read trace {label}: {exc}") from None
    with fh:
        stream = _Stream(fh, label)
        first = stream.peek()
        if first == "":
            raise InputError(f"{label} is empty: not a Kineto trace")
        if first != "{":
            if first == "[":
                raise InputError(
                    f"{label} is not a Kineto trace: a JSON list, not an object with "
                    "'traceEvents' (a memory timeline export?)"
                )
            stream.value()  # raises the JSON error if it is not JSON at all
            raise InputError(f"{label} is not a Kineto trace: not a JSON object")
        stream.pos += 1
        while True:
            char = stream.peek()
            if char == "}":
                stream.pos += 1
                break
            if char == ",":
                stream.pos += 1
                continue
            key = stream.value()
            if not isinstance(key, str):
                raise InputError(f"{label} is not valid JSON: object key is not a string")
            stream.expect(":", "':' after a key")
            if key == "traceEvents":
                if stream.peek() != "[":
                    raise InputError(f"{label} is not a Kineto trace: 'traceEvents' is not a list")
                stream.pos += 1
                _read_events(stream, build)
                seen_events = True
            else:
                keep_meta(meta, key, stream.value())
        if stream.peek() != "":
            raise InputError(f"{label} is not valid JSON: data after the top-level object")
    if not seen_events:
        hint = " (a PyTorch execution trace?)" if "nodes" in meta else ""
        raise InputError(f"{label} is not a Kineto trace: no 'traceEvents' list{hint}")
    return build.finish(path, meta, index, "lenient")
