"""The standard-library path of the trace reader: any layout, and the errors for bad input.

The file (``.json`` or ``.json.gz``) is streamed in chunks of text. Two parsers produce the
same records:

- regular expressions over a chunk of events written in the layout Kineto (and ``json.dump``)
  uses, ``"ph": "X", "cat": ..., "name": ..., "pid": ..., "tid": ..., "ts": ..., "dur": ...``.
  A chunk is taken this way only when every complete event (``"X"``) in it matched, so no
  event is ever silently dropped;
- ``json.JSONDecoder.raw_decode`` one event at a time, for any other layout.

It runs where msgspec is not installed, and for every file the msgspec path hands over
(:class:`~ampdiag.trace.reader.Fallback`): odd events are skipped and counted here, and bad
input gets its one clear line here.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import math
import re
import zlib
from pathlib import Path
from typing import IO, Any

from ampdiag.errors import InputError
from ampdiag.trace.reader import (
    _STEP_RE,
    ANNOTATION_CATS,
    GPU_CATS,
    HOST_OP_CATS,
    KERNEL_CATS,
    LAUNCH_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    RankTrace,
    _meta_value,
    apply_meta,
)
from ampdiag.trace.step_breakdown import classify

CHUNK_CHARS = 4 << 20

_GPU_KIND = {**dict.fromkeys(KERNEL_CATS, "kernel"), **dict.fromkeys(MEMCPY_CATS, "memcpy")}
_GPU_KIND.update(dict.fromkeys(MEMSET_CATS, "memset"))

_GZIP_ERRORS: tuple[type[Exception], ...] = (EOFError, zlib.error, gzip.BadGzipFile)
try:
    from isal import isal_zlib

    _GZIP_ERRORS += (isal_zlib.error,)  # type: ignore[operator]
except ImportError:  # pragma: no cover - isal is optional
    pass

_WS = re.compile(r"[ \t\n\r]*")
# A JSON number, exactly (a looser pattern let "1-2" through to float(): a traceback).
_NUM = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_PREFIX = (
    r'"ph"\s*:\s*"X"\s*,\s*"cat"\s*:\s*"{cat}"\s*,\s*"name"\s*:\s*"([^"\\]*(?:\\.[^"\\]*)*)"'
    r'\s*,\s*"pid"\s*:\s*("[^"\\]*"|NUM)\s*,\s*"tid"\s*:\s*(?:"[^"\\]*"|NUM)'
    r'\s*,\s*"ts"\s*:\s*(NUM)\s*,\s*"dur"\s*:\s*(NUM)'
).replace("NUM", _NUM)


@functools.cache
def _fast_patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """The regex path's patterns, compiled on first use (the msgspec path needs none).

    Every complete event: (cat, name, pid, ts, dur); GPU activities and launch calls again,
    with their args object (no nested objects in it); and an int in that object.
    """
    every = re.compile(_PREFIX.format(cat=r'([^"\\]*)'))
    with_args = re.compile(
        _PREFIX.format(cat="(" + "|".join(sorted(GPU_CATS | LAUNCH_CATS)) + ")")
        + r'\s*,\s*"args"\s*:\s*\{([^{}]*)\}'
    )
    return every, with_args, re.compile(r'"(stream|correlation)"\s*:\s*(-?\d+)')


_DECODER = json.JSONDecoder()
_ARG_CATS = GPU_CATS | LAUNCH_CATS


def _num(text: str) -> float:
    return float(text)


class _Sink:
    """Turns events (from either path) into the RankTrace's records."""

    def __init__(self, out: RankTrace) -> None:
        self.out = out
        self.names: dict[str, str] = {}

    def skip(self, why: str) -> None:
        self.out.skipped[why] = self.out.skipped.get(why, 0) + 1

    def add(
        self,
        cat: str,
        name: str,
        pid: Any,
        ts: float,
        dur: float,
        stream: int,
        corr: int,
    ) -> None:
        """One complete ("X") event with finite times."""
        if not (math.isfinite(ts) and math.isfinite(dur)):
            self.skip("non-finite timestamp or duration")
            return
        if dur < 0:
            self.skip("negative duration")
            return
        out = self.out
        kind = _GPU_KIND.get(cat)
        if kind is not None:
            name = self.names.setdefault(name, name)
            out.gpu.append((ts, dur, stream, corr, name, kind))
            return
        if cat in LAUNCH_CATS:
            if corr >= 0:
                out.launches[corr] = (ts, dur, self.names.setdefault(name, name))
            return
        if name.startswith("ProfilerStep"):
            m = _STEP_RE.match(name)
            if m:
                out.steps.append((int(m.group(1)), ts, ts + dur, pid))
                return
        if cat in HOST_OP_CATS:
            stat = out.cpu_ops.get(name)
            if stat is None:
                out.cpu_ops[name] = [1, dur]
            else:
                stat[0] += 1
                stat[1] += dur
        if cat in HOST_OP_CATS or cat in ANNOTATION_CATS:
            category = classify(name, "cpu_op" if cat in HOST_OP_CATS else cat)
            if category is not None:
                out.host.append((ts, ts + dur, category, pid))

    def add_dict(self, ev: Any) -> None:
        """One event from the general path (any JSON value)."""
        self.out.events += 1
        if not isinstance(ev, dict):
            self.skip("not a JSON object")
            return
        if ev.get("ph") != "X":
            return
        try:
            ts = float(ev["ts"])
            dur = float(ev["dur"])
        except (KeyError, TypeError, ValueError, OverflowError):
            self.skip("missing or invalid ts/dur")
            return
        name, cat = ev.get("name"), ev.get("cat")
        if not isinstance(name, str) or not isinstance(cat, str):
            self.skip("missing name or cat")
            return
        stream = corr = -1
        raw_args = ev.get("args")
        if cat in _ARG_CATS and isinstance(raw_args, dict):
            stream, corr = _arg_int(raw_args.get("stream")), _arg_int(raw_args.get("correlation"))
        pid = ev.get("pid")
        self.add(cat, name, pid if isinstance(pid, str) else json.dumps(pid), ts, dur, stream, corr)


def _arg_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 40:
        return int(value)
    return -1


class _Stream:
    """A text buffer over the file that grows by chunks (everything before ``pos`` is dropped)."""

    def __init__(self, fh: IO[str], label: str) -> None:
        self.fh = fh
        self.label = label
        self.buf = ""
        self.pos = 0
        self.base = 0  # offset of buf[0] in the file's text
        self.fills = 0  # how many times the buffer grew
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.fh.read(CHUNK_CHARS)
        except _GZIP_ERRORS as exc:
            raise InputError(
                f"cannot read trace {self.label}: truncated or corrupt ({exc})"
            ) from None
        except UnicodeDecodeError as exc:
            raise InputError(f"cannot read trace {self.label}: not UTF-8 text ({exc})") from None
        except OSError as exc:
            raise InputError(f"cannot read trace {self.label}: {exc}") from None
        if not data:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + data
        self.base += self.pos
        self.pos = 0
        self.fills += 1
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
                near_end = exc.pos >= len(self.buf) - 1 or exc.msg.startswith("Unterminated")
                if near_end and self.fill():
                    continue
                raise InputError(
                    f"{self.label} is not valid JSON: {exc.msg} (character {exc.pos} of a chunk)"
                    + ("; the file looks truncated" if self.eof and near_end else "")
                ) from None
            except (ValueError, RecursionError) as exc:
                raise InputError(f"{self.label}: cannot decode a value: {exc}") from None
            # A number (or literal) cut at the end of the buffer decodes "successfully": make
            # sure a delimiter follows before trusting it.
            if _WS.match(self.buf, end).end() >= len(self.buf) and self.fill():  # type: ignore[union-attr]
                continue
            self.pos = end
            return val


def _open_text(path: Path) -> IO[str]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    raw: Any
    if magic != b"\x1f\x8b":
        raw = open(path, "rb")  # noqa: SIM115
    else:
        try:  # ISA-L's gunzip where installed: 2-3x faster than zlib's
            from isal import igzip

            raw = igzip.open(path, "rb")  # type: ignore[no-untyped-call]
        except ImportError:
            raw = gzip.open(path, "rb")  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict")


def _fast_region(region: str, sink: _Sink) -> bool:
    """Reads a run of complete events with the regex fast path; False if any "X" event eluded it."""
    every, args_pattern, arg_int = _fast_patterns()
    rows = every.findall(region)
    if len(rows) != region.count('"X"'):
        return False
    with_args = args_pattern.findall(region)
    if len(with_args) != sum(1 for r in rows if r[0] in _ARG_CATS):
        return False
    sink.out.events += region.count('"ph"')
    add = sink.add
    for cat, name, pid, ts_s, dur_s in rows:
        if cat in _ARG_CATS:
            continue
        if "\\" in name:
            name = json.loads(f'"{name}"')
        add(cat, name, pid.strip('"'), float(ts_s), float(dur_s), -1, -1)
    find_ints = arg_int.findall
    for cat, name, pid, ts_s, dur_s, args in with_args:
        if "\\" in name:
            name = json.loads(f'"{name}"')
        ints = dict(find_ints(args))
        try:
            stream, corr = int(ints.get("stream", -1)), int(ints.get("correlation", -1))
        except ValueError:  # too many digits to convert
            sink.skip("invalid stream or correlation")
            continue
        add(cat, name, pid.strip('"'), float(ts_s), float(dur_s), stream, corr)
    return True


def _last_event_start(buf: str, lo: int) -> int:
    """Position of the last ``{"ph"`` event start in buf after lo, or -1."""
    hi = len(buf)
    while True:
        k = buf.rfind('"ph"', lo, hi)
        if k < 0:
            return -1
        j = k - 1
        while j > lo and buf[j] in " \t\r\n":
            j -= 1
        if buf[j] == "{":
            return j
        hi = k


def _read_events(stream: _Stream, sink: _Sink) -> None:
    """Reads the traceEvents array (the '[' already consumed)."""
    first = True
    no_cut_in = -1  # the buffer (by fill count) in which no event start was found
    while True:
        char = stream.peek()
        if char == "]":
            stream.pos += 1
            return
        if not first:
            if char != ",":
                stream.expect(",", "',' or ']' in traceEvents")
            stream.pos += 1
        first = False
        if stream.peek() == "":
            raise InputError(f"{stream.label} ends inside traceEvents: the file looks truncated")
        # Fast path over the complete events already in the buffer.
        cut = -1
        if no_cut_in != stream.fills and stream.buf[stream.pos] == "{":
            cut = _last_event_start(stream.buf, stream.pos)
            if cut <= stream.pos:
                no_cut_in = stream.fills
        if cut > stream.pos:
            region = stream.buf[stream.pos : cut]
            if _fast_region(region, sink):
                stream.pos = cut
                first = True
                continue
            cut_at = stream.base + cut
            while stream.base + stream.pos < cut_at:
                sink.add_dict(stream.value())
                if stream.peek() == ",":
                    stream.pos += 1
            first = True
            continue
        if stream.peek() == "":
            raise InputError(f"{stream.label} ends inside traceEvents: the file looks truncated")
        sink.add_dict(stream.value())


def read_stdlib(p: Path, index: int = 0) -> RankTrace:
    """Reads one trace file with the standard-library path (see the module's docstring)."""
    label = repr(str(p))
    out = RankTrace(path=p, rank=index)
    sink = _Sink(out)
    seen_events = False
    try:
        fh = _open_text(p)
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
                _read_events(stream, sink)
                seen_events = True
            else:
                _meta_value(out, key, stream.value())
        if stream.peek() not in ("",):
            raise InputError(f"{label} is not valid JSON: data after the top-level object")
    if not seen_events:
        hint = " (a PyTorch execution trace?)" if "nodes" in out.meta else ""
        raise InputError(f"{label} is not a Kineto trace: no 'traceEvents' list{hint}")
    apply_meta(out, index)
    return out
