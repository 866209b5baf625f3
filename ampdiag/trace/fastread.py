"""The fast path of the trace reader: typed msgspec decoding of chunks of whole events.

The decompressed file (gzip through ISA-L's ``isal`` when installed) is read in chunks of
bytes. Each chunk is cut after the last complete event (a ``}`` followed by ``,`` and ``{``)
and the run of events before the cut is decoded at once by msgspec into small typed structs
that hold only the fields the analysis needs: for complete (``"X"``) events ``name``, ``cat``,
``pid``, ``ts``, ``dur`` and ``args.stream`` / ``args.correlation``; for events of any other
phase, nothing. Every other field is skipped by msgspec without building a Python object. The
structs are turned into compact columns (``array.array``; numpy arrays at the end) chunk by
chunk, so memory stays bounded by the chunk size plus the columns. A large file is read by
several processes at once (:mod:`ampdiag.trace.parallel`).

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
import re
from array import array
from pathlib import Path
from typing import IO, Annotated, Any, Union

import msgspec

from ampdiag.trace.reader import (
    ANNOTATION_CATS,
    HOST_OP_CATS,
    KERNEL_CATS,
    LAUNCH_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    Fallback,
    RankTrace,
    _meta_value,
)
from ampdiag.trace.step_breakdown import classify

CHUNK_BYTES = 2 << 20
MAX_HEAD_BYTES = 64 << 20

_Finite = Annotated[float, msgspec.Meta(ge=-1e300, le=1e300)]
_Duration = Annotated[float, msgspec.Meta(ge=0.0, le=1e300)]


class _Args(msgspec.Struct, gc=False):
    stream: int = -1
    correlation: int = -1


class _Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    name: str
    cat: str
    ts: _Finite
    dur: _Duration
    pid: int | str | None = None
    args: _Args | None = None


# Every other phase of the Chrome trace format: decoded to an empty struct (all fields skipped).
_PHASES: tuple[str, ...] = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O")
_PHASES += ("N", "D", "M", "V", "v", "R", "c", "(", ")", "T", "S", "p", "F")
_OTHER = tuple(
    msgspec.defstruct(f"_Phase{i}", [], gc=False, tag_field="ph", tag=ph)
    for i, ph in enumerate(_PHASES)
)
_EVENT: Any = Union.__getitem__((_Complete, *_OTHER))
_DECODER: Any = msgspec.json.Decoder(list[_EVENT])

_KIND = {
    **dict.fromkeys(KERNEL_CATS, 0),
    **dict.fromkeys(MEMCPY_CATS, 1),
    **dict.fromkeys(MEMSET_CATS, 2),
}
_GROUP = {
    **dict.fromkeys(_KIND, "gpu"),
    **dict.fromkeys(LAUNCH_CATS, "launch"),
    **dict.fromkeys(HOST_OP_CATS, "op"),
}
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")


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


class _Builder:
    """Accumulates the columns, chunk by chunk."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.pid_raw: dict[Any, int] = {}
        self.events = 0
        # column name -> arrays, one per chunk: g_* GPU activities, l_* launch calls, h_* host
        # events (h_kind 0: op such as cpu_op, 1: annotation, 2: any other category)
        self.parts: dict[str, list[Any]] = {}
        # per-chunk groups, emptied after each chunk; routed by category
        self._gpu: list[_Complete] = []
        self._launch: list[_Complete] = []
        self._ops: list[_Complete] = []
        self._rest: list[_Complete] = []
        groups = {"gpu": self._gpu, "launch": self._launch, "op": self._ops}
        self._route = {cat: groups[g].append for cat, g in _GROUP.items()}

    def _put(self, key: str, values: list[Any], typecode: str) -> None:
        # array.array, not numpy: a worker process of the parallel reader never imports numpy
        self.parts.setdefault(key, []).append(array(typecode, values))

    def _col(self, key: str, dtype: Any) -> Any:
        import numpy as np

        # taken out of the builder, so each part is freed once concatenated (peak memory)
        parts = [np.frombuffer(p, dtype=dtype) for p in self.parts.pop(key, ())]
        if not parts:
            return np.empty(0, dtype=dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @staticmethod
    def _ids(
        table: dict[Any, int], keys: list[Any], text: dict[str, int] | None = None
    ) -> list[int]:
        """Dense ids of keys, new keys getting the next ones.

        With ``text`` (pids), keys are told apart by their JSON text (1 and "1" are one pid):
        ``table`` maps the raw key, ``text`` the text, to the id.
        """
        ids: list[Any] = list(map(table.get, keys))
        if None in ids:
            for key in [k for k, got in zip(keys, ids, strict=True) if got is None]:
                if key not in table:
                    if text is None:
                        table[key] = len(table)
                    else:
                        table[key] = text.setdefault(_pid_text(key), len(text))
            ids = list(map(table.get, keys))
        return ids

    def add(self, evs: list[Any]) -> None:
        """Routes one chunk's events and appends their columns."""
        self.events += len(evs)
        route = self._route
        other = self._rest.append
        complete = _Complete
        for e in evs:
            if e.__class__ is complete:
                route.get(e.cat, other)(e)
        names = self.names
        put, f64, i64 = self._put, "d", "q"
        gpu, launch = self._gpu, self._launch
        if gpu:
            put("g_ts", [e.ts for e in gpu], f64)
            put("g_dur", [e.dur for e in gpu], f64)
            args = [e.args for e in gpu]
            put("g_stream", [-1 if a is None else a.stream for a in args], i64)
            put("g_corr", [-1 if a is None else a.correlation for a in args], i64)
            put("g_name", self._ids(names, [e.name for e in gpu]), i64)
            put("g_kind", [_KIND[e.cat] for e in gpu], i64)
            gpu.clear()
        if launch:
            corr = [-1 if a is None else a.correlation for a in [e.args for e in launch]]
            if min(corr) < 0:
                launch = [e for e, c in zip(launch, corr, strict=True) if c >= 0]
                corr = [c for c in corr if c >= 0]
            put("l_corr", corr, i64)
            put("l_ts", [e.ts for e in launch], f64)
            put("l_dur", [e.dur for e in launch], f64)
            put("l_name", self._ids(names, [e.name for e in launch]), i64)
            self._launch.clear()
        for kind, host in enumerate((self._ops, self._rest)):
            if not host:
                continue
            put("h_ts", [e.ts for e in host], f64)
            put("h_dur", [e.dur for e in host], f64)
            put("h_name", self._ids(names, [e.name for e in host]), i64)
            put("h_pid", self._ids(self.pid_raw, [e.pid for e in host], self.pids), i64)
            if kind == 0:
                self.parts.setdefault("h_kind", []).append(array("q", bytes(8 * len(host))))
            else:
                put("h_kind", [1 if e.cat in ANNOTATION_CATS else 2 for e in host], i64)
            host.clear()

    def state(self) -> tuple[int, list[str], dict[Any, int], list[str], dict[str, list[Any]]]:
        """What `absorb` takes: the events read, the name and pid tables and the columns."""
        return self.events, list(self.names), self.pid_raw, list(self.pids), self.parts

    def absorb(
        self, state: tuple[int, list[str], dict[Any, int], list[str], dict[str, list[Any]]]
    ) -> None:
        """Appends the columns of the part read after this one (see `state`).

        Its names and pids are renumbered into this builder's tables, which then list them in
        the order one reader of the whole file would have met them.
        """
        import numpy as np

        events, names, pid_raw, pids, parts = state
        self.events += events
        name_id = np.array([self.names.setdefault(n, len(self.names)) for n in names], np.int64)
        pid_id = np.array([self.pids.setdefault(p, len(self.pids)) for p in pids], np.int64)
        for raw, local in pid_raw.items():
            self.pid_raw.setdefault(raw, int(pid_id[local]))
        for key, arrays in parts.items():
            remap = pid_id if key == "h_pid" else name_id if key.endswith("_name") else None
            if remap is not None:
                arrays = [remap[np.frombuffer(a, dtype=np.int64)] for a in arrays]
            self.parts.setdefault(key, []).extend(arrays)

    def finish(self, out: RankTrace) -> None:
        """Puts the columns, steps and CPU op totals into ``out``."""
        import numpy as np

        from ampdiag.trace.columns import HOST_CATEGORIES, Columns

        host_cat_index = {c: i for i, c in enumerate(HOST_CATEGORIES)}
        names = list(self.names)
        pids = list(self.pids)
        f64, i64 = np.float64, np.int64
        # GPU activities, sorted by start (stable, as the general path sorts them)
        g_ts = self._col("g_ts", f64)
        order = np.argsort(g_ts, kind="stable")
        # launches: the last call of a correlation id wins, as in a dict
        l_corr = self._col("l_corr", i64)
        by_corr = np.argsort(l_corr, kind="stable")
        sorted_corr = l_corr[by_corr]
        last_of_run = np.ones(len(sorted_corr), dtype=bool)
        np.not_equal(sorted_corr[:-1], sorted_corr[1:], out=last_of_run[:-1])
        last = by_corr[last_of_run]
        # host events: steps, CPU op totals and the spans the step breakdown counts
        h_name = self._col("h_name", i64)
        h_kind = self._col("h_kind", i64)
        h_ts = self._col("h_ts", f64)
        h_dur = self._col("h_dur", f64)
        h_pid = self._col("h_pid", i64)
        n_names = len(names)
        step_no = np.full(n_names, -1, dtype=np.int64)
        cat_op = np.full(n_names, -1, dtype=np.int64)
        cat_ann = np.full(n_names, -1, dtype=np.int64)
        for i in np.flatnonzero(np.bincount(h_name, minlength=n_names)).tolist():
            name = names[i]
            if name.startswith("ProfilerStep"):
                m = _STEP_RE.match(name)
                if m:
                    step_no[i] = int(m.group(1))
                    continue
            c = classify(name, "cpu_op")
            cat_op[i] = -1 if c is None else host_cat_index[c]
            c = classify(name, "user_annotation")
            cat_ann[i] = -1 if c is None else host_cat_index[c]
        is_step = step_no[h_name] >= 0
        for j in np.flatnonzero(is_step).tolist():
            ts = float(h_ts[j])
            out.steps.append(
                (int(step_no[h_name[j]]), ts, ts + float(h_dur[j]), pids[int(h_pid[j])])
            )
        ops = np.flatnonzero((h_kind == 0) & ~is_step)
        if len(ops):
            op_names = h_name[ops]
            calls = np.bincount(op_names, minlength=n_names)
            inclusive = np.bincount(op_names, weights=h_dur[ops], minlength=n_names)
            first = np.full(n_names, len(ops), dtype=np.int64)
            np.minimum.at(first, op_names, np.arange(len(ops)))
            used = np.flatnonzero(calls)
            used = used[np.argsort(first[used], kind="stable")]
            out.cpu_ops = {names[i]: [int(calls[i]), float(inclusive[i])] for i in used.tolist()}
        host_cat = np.where(h_kind == 0, cat_op[h_name], np.where(h_kind == 1, cat_ann[h_name], -1))
        host_cat[is_step] = -1
        keep = np.flatnonzero(host_cat >= 0)
        out._gpu = out._launches = out._host = None
        out._cols = Columns(
            names=names,
            gpu_ts=g_ts[order],
            gpu_dur=self._col("g_dur", f64)[order],
            gpu_stream=self._col("g_stream", i64)[order],
            gpu_corr=self._col("g_corr", i64)[order],
            gpu_name=self._col("g_name", i64)[order],
            gpu_kind=self._col("g_kind", i64)[order],
            launch_corr=sorted_corr[last_of_run],
            launch_ts=self._col("l_ts", f64)[last],
            launch_dur=self._col("l_dur", f64)[last],
            launch_name=self._col("l_name", i64)[last],
            host_start=h_ts[keep],
            host_end=h_ts[keep] + h_dur[keep],
            host_cat=host_cat[keep].astype(np.int64),
            host_pid=h_pid[keep],
            pids=pids,
        )
        out.events = self.events


def _pid_text(pid: Any) -> str:
    """A pid as the general reader keys it (JSON text of a number, a string as it is)."""
    return pid if isinstance(pid, str) else json.dumps(pid)


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


def _decode_list(data: Any) -> list[Any]:
    try:
        return _DECODER.decode(data)  # type: ignore[no-any-return]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Fallback(str(exc)) from None


def _decode(buf: bytearray, lo: int, hi: int) -> list[Any]:
    """Decodes buf[lo + 1 : hi - 1], a run of whole events, as a list (without copying it)."""
    saved = buf[lo], buf[hi - 1]
    buf[lo], buf[hi - 1] = 0x5B, 0x5D  # '[' and ']' around the run, restored below
    try:
        with memoryview(buf) as mv:
            return _decode_list(mv[lo:hi])
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


def read_part(path: Path, lo: int = 0, hi: int | None = None) -> tuple[RankTrace, _Builder, bool]:
    """Decodes the events of one part of a file (all of it by default), unfinished.

    Args:
        path: The trace file.
        lo: Where the part starts in the decompressed bytes (see `_read`).
        hi: Where the next part starts (None: the part runs to the end of the file).

    Returns:
        (the RankTrace with the top-level keys read, the builder holding the part's columns,
        whether the part reached the end of ``traceEvents``).

    Raises:
        Fallback: Anything this path does not handle.
    """
    out = RankTrace(path=path)
    build = _Builder()
    try:
        fh = _open_binary(path)
    except OSError:
        raise Fallback("open") from None
    try:
        with fh:
            ended = _read(fh, out, build, lo, hi)
    except Fallback:
        raise
    except Exception as exc:  # truncated gzip, I/O errors...: the general reader reports them
        raise Fallback(repr(exc)) from None
    return out, build, ended


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
    fh: IO[bytes], out: RankTrace, build: _Builder, lo: int = 0, hi: int | None = None
) -> bool:
    """Decodes the events of the part ``[lo, hi)`` of the decompressed bytes into ``build``.

    A part starts at the first event after the first ``}`` at or after its offset (and after
    the ``[`` of traceEvents) that ends an event (is followed by ``,`` and ``{``); the part
    before it ends there. Every process finds that place alike from the same bytes, so the
    parts of one file, read by different processes, hold every event exactly once.

    Returns:
        Whether this part reached the end of traceEvents (then it also read the rest of the
        top-level object); False when the next part starts before the end, or no event
        starts in this part.
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
                    return False  # the next part starts at the same event: this one is empty
                pos = s.end() - 1  # its '{'
                break
            if n < len(buf):
                return False  # no event starts in this part
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
                build.add(_decode(buf, pos - 1, s.start() + 2))
                return False
        # the run of events up to the last boundary between two events in the buffer
        cut = buf.rfind(b"}", pos, n)
        while cut >= pos:
            b = _BOUNDARY.match(buf, cut, n)
            if b:
                build.add(_decode(buf, pos - 1, cut + 2))
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
    build.add(_decode_list(b"[" + tail_bytes[:close] + b"]"))
    rest = tail[end - 1 :].strip()
    if rest.startswith(","):
        _top_level("{" + rest[1:], out)
    elif rest != "}":
        raise Fallback("after traceEvents")
    return True
