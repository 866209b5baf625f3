"""The events the reader decodes, and the columns it keeps of them: category routing, once.

Both paths of the reader end here. The decoder (:mod:`ampdiag.trace.decode`) has msgspec decode
runs of events straight into the small structs below, which hold only the fields the analysis
needs; the lenient paths (an odd run, or a whole file the decoder does not cut) decode with the
standard library and turn each event into the same structs with :func:`event_from_dict`, which
holds the rules for odd events (skipped and counted by reason). A :class:`ColumnBuilder` routes
the structs by category (GPU activity, launch call, host op, other host event, ``[memory]``
allocator event) into compact ``array.array`` columns, and ``finish`` makes the one
:class:`~ampdiag.trace.records.RankTrace` of the file.
"""

from __future__ import annotations

import json
import math
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, ClassVar, Union

import msgspec
import numpy as np

from ampdiag.trace.columns import HOST_CATEGORIES, Columns
from ampdiag.trace.records import (
    ANNOTATION_CATS,
    GPU_CATS,
    HOST_OP_CATS,
    KERNEL_CATS,
    LAUNCH_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    MTIA_CATS,
    STEP_RE,
    RankTrace,
    apply_meta,
)
from ampdiag.trace.step_breakdown import classify

_Finite = Annotated[float, msgspec.Meta(ge=-1e300, le=1e300)]
_Duration = Annotated[float, msgspec.Meta(ge=0.0, le=1e300)]
_I64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
MEMORY_EVENT = "[memory]"


class Args(msgspec.Struct, gc=False, frozen=True):
    """What the analysis reads of a complete event's ``args`` (-1: absent)."""

    stream: _I64 = -1
    correlation: _I64 = -1


NO_ARGS = Args()
"""The args of an event without them: always an Args, so the builder reads its fields without a
test per event (``"args": null`` makes msgspec refuse the run, repaired by the standard library)."""


class Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X", kw_only=True):
    """A complete event: what the analysis reads of it.

    The fields in the order Kineto writes them, so msgspec finds each key at its first try.
    """

    cat: str
    name: str
    pid: int | str | None = None
    tid: int | str | None = None
    ts: _Finite
    dur: _Duration
    args: Args = NO_ARGS


class MemoryArgs(msgspec.Struct, gc=False):
    """The allocator's fields of a ``[memory]`` instant event."""

    addr: _I64 = msgspec.field(default=0, name="Addr")
    size: _I64 = msgspec.field(default=0, name="Bytes")
    device_type: _I64 = msgspec.field(default=-1, name="Device Type")
    device_id: _I64 = msgspec.field(default=-1, name="Device Id")
    allocated: _I64 = msgspec.field(default=-1, name="Total Allocated")
    reserved: _I64 = msgspec.field(default=-1, name="Total Reserved")


# the category the router sees for events whose ``cat`` it does not decode (a class attribute):
# every event is routed by ``cat`` in one dict lookup. A complete event whose category is one
# of these (a NUL escaped in JSON) is dropped, not misread: the class is checked after routing.
OTHER_PHASE = "\x00other phase"
INSTANT = "\x00instant"


class Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    """An instant event; only ``[memory]`` ones are kept."""

    cat: ClassVar[str] = INSTANT
    name: str = ""
    tid: int | str | None = None
    ts: _Finite = 0.0
    args: MemoryArgs | None = None


# Every other phase of the Chrome trace format: decoded to an empty struct (all fields skipped).
_PHASES: tuple[str, ...] = ("B", "E", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O")
_PHASES += ("N", "D", "M", "V", "v", "R", "c", "(", ")", "T", "S", "p", "F")
_OTHER = tuple(
    msgspec.defstruct(
        f"_Phase{i}", [], gc=False, tag_field="ph", tag=ph, namespace={"cat": OTHER_PHASE}
    )
    for i, ph in enumerate(_PHASES)
)
_EVENT: Any = Union.__getitem__((Complete, Instant, *_OTHER))
EVENTS_DECODER: Any = msgspec.json.Decoder(list[_EVENT])
"""Decodes a JSON array of trace events into the structs (fields not listed are skipped)."""


_MTIA = 3  # a kernel once its stream is checked (``finish``)
_KIND = {
    **dict.fromkeys(KERNEL_CATS, 0),
    **dict.fromkeys(MEMCPY_CATS, 1),
    **dict.fromkeys(MEMSET_CATS, 2),
    **dict.fromkeys(MTIA_CATS, _MTIA),
}
_GROUP = {
    **dict.fromkeys(_KIND, "gpu"),
    **dict.fromkeys(LAUNCH_CATS, "launch"),
    **dict.fromkeys(HOST_OP_CATS, "op"),
}
_INT64 = range(-(1 << 63), 1 << 63)


def _arg_int(value: Any) -> int:
    """An int arg as the decoder reads it (-1: absent, not an int, or beyond 64 bits)."""
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 40:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in _INT64:
        return value
    return -1


def event_from_dict(ev: Any, skip: dict[str, int]) -> Any:
    """The struct of one event decoded by the standard library; None to ignore it.

    The rules for odd events, in one place: an event that is not an object, a complete event
    with missing or invalid ``ts``/``dur``, a non-finite time, a negative duration, or no string
    ``name``/``cat`` is skipped and counted in ``skip`` by reason.
    """

    def skipped(why: str) -> None:
        skip[why] = skip.get(why, 0) + 1

    if not isinstance(ev, dict):
        skipped("not a JSON object")
        return None
    ph = ev.get("ph")
    if ph == "i" and ev.get("name") == MEMORY_EVENT:
        a = ev.get("args")
        a = a if isinstance(a, dict) else {}
        ts = ev.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
            skipped("missing or invalid ts/dur")
            return None
        mem = MemoryArgs(
            *(_arg_int(a.get(k, 0)) for k in ("Addr", "Bytes")),
            *(_arg_int(a.get(k)) for k in ("Device Type", "Device Id")),
            *(_arg_int(a.get(k)) for k in ("Total Allocated", "Total Reserved")),
        )
        tid = ev.get("tid")
        tid = tid if tid is None or isinstance(tid, str) or type(tid) is int else json.dumps(tid)
        return Instant(MEMORY_EVENT, tid, float(ts), mem)
    if ph != "X":
        return None
    try:
        ts = float(ev["ts"])
        dur = float(ev["dur"])
    except (KeyError, TypeError, ValueError, OverflowError):
        skipped("missing or invalid ts/dur")
        return None
    name, cat = ev.get("name"), ev.get("cat")
    if not isinstance(name, str) or not isinstance(cat, str):
        skipped("missing name or cat")
        return None
    if not (math.isfinite(ts) and math.isfinite(dur)):
        skipped("non-finite timestamp or duration")
        return None
    if dur < 0:
        skipped("negative duration")
        return None
    args = NO_ARGS
    raw = ev.get("args")
    if cat in GPU_CATS or cat in LAUNCH_CATS:
        raw = raw if isinstance(raw, dict) else {}
        args = Args(_arg_int(raw.get("stream", -1)), _arg_int(raw.get("correlation", -1)))
    pid, tid = ev.get("pid"), ev.get("tid")
    if not (pid is None or isinstance(pid, str) or type(pid) is int):
        pid = json.dumps(pid)  # a float or an object: keyed by its JSON text
    if not (tid is None or isinstance(tid, str) or type(tid) is int):
        tid = json.dumps(tid)
    return Complete(cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=args)


class ColumnBuilder:
    """Accumulates the columns of decoded events, run by run, and makes the RankTrace."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.pid_raw: dict[Any, int] = {}
        self.tid_raw: dict[Any, int] = {}
        self.tids: dict[str, int] = {}
        self.events = 0
        self.skipped: dict[str, int] = {}
        # column name -> arrays, one per run: g_* GPU activities, l_* launch calls, h_* host
        # events (h_kind 0: op such as cpu_op, 1: annotation, 2: any other category)
        self.parts: dict[str, list[Any]] = {}
        # per-run groups, emptied after each run; routed by category
        self._gpu: list[Any] = []
        self._launch: list[Any] = []
        self._ops: list[Any] = []
        self._rest: list[Any] = []
        self._instants: list[Any] = []
        self._dropped: list[Any] = []
        groups = {"gpu": self._gpu, "launch": self._launch, "op": self._ops}
        self._route = {cat: groups[g].append for cat, g in _GROUP.items()}
        self._route[INSTANT] = self._instants.append
        self._route[OTHER_PHASE] = self._dropped.append

    def _put(self, key: str, values: Any) -> None:
        self.parts.setdefault(key, []).append(values)

    def _col(self, key: str, dtype: Any) -> Any:
        # taken out of the builder, so each part is freed once concatenated (peak memory)
        parts = self.parts.pop(key, [])
        if not parts:
            return np.empty(0, dtype=dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def add_dicts(self, evs: list[Any], events: int | None = None) -> None:
        """Adds events decoded by the standard library (see :func:`event_from_dict`).

        Args:
            evs: The events.
            events: How many events to count as read (default: all of ``evs``).
        """
        structs = [event_from_dict(e, self.skipped) for e in evs]
        self.add([s for s in structs if s is not None], len(evs) if events is None else events)

    @staticmethod
    def _ids(table: dict[Any, int], keys: list[Any], text: dict[str, int] | None = None) -> Any:
        """Dense ids of keys (an int64 array), new keys getting the next ones.

        With ``text`` (pids, tids), keys are told apart by their JSON text (1 and "1" are one):
        ``table`` maps the raw key, ``text`` the text, to the id.
        """
        try:
            return _i64(map(table.__getitem__, keys), len(keys))
        except KeyError:  # new keys (found in C)
            pass
        for key in keys:
            if key not in table:
                if text is None:
                    table[key] = len(table)
                else:
                    table[key] = text.setdefault(_pid_text(key), len(text))
        return _i64(map(table.__getitem__, keys), len(keys))

    def add(self, evs: list[Any], events: int | None = None) -> None:
        """Routes one run of decoded structs and appends their columns.

        One pass routes the events by category; then one comprehension per column and group.
        This is the reader's only Python code per event, as lean as it goes: each extra test
        or pass per event costs about as much as decoding the field did.

        Args:
            evs: The structs (``Complete``, ``Instant``, other phases: ignored).
            events: How many events to count as read (default: ``len(evs)``).
        """
        self.events += len(evs) if events is None else events
        route = self._route
        other = self._rest.append
        for e in evs:
            route.get(e.cat, other)(e)
        if self._instants:
            mem = [
                e
                for e in self._instants
                if e.__class__ is Instant and e.name == MEMORY_EVENT and e.args is not None
            ]
            if mem:
                args: list[Any] = [e.args for e in mem]
                self._put("m_ts", _f64([e.ts for e in mem]))
                self._put("m_addr", _i64([a.addr for a in args]))
                self._put("m_size", _i64([a.size for a in args]))
                self._put("m_device_type", _i64([a.device_type for a in args]))
                self._put("m_device_id", _i64([a.device_id for a in args]))
                self._put("m_allocated", _i64([a.allocated for a in args]))
                self._put("m_reserved", _i64([a.reserved for a in args]))
                # threads by tid alone (a Linux tid is unique across processes), 123 and
                # "123" one thread (the plugin's tests write ops' tids as strings, memory's not)
                self._put("m_tid", self._ids(self.tid_raw, [e.tid for e in mem], self.tids))
        self._instants.clear()
        self._dropped.clear()
        names = self.names
        put = self._put
        gpu, launch = self._gpu, self._launch
        if gpu:
            put("g_ts", _f64([e.ts for e in gpu]))
            put("g_dur", _f64([e.dur for e in gpu]))
            put("g_stream", _i64([e.args.stream for e in gpu]))
            put("g_corr", _i64([e.args.correlation for e in gpu]))
            put("g_name", self._ids(names, [e.name for e in gpu]))
            put("g_kind", _i64([_KIND[e.cat] for e in gpu]))
            gpu.clear()
        if launch:
            corr = _i64([e.args.correlation for e in launch])
            if corr.min() < 0:
                launch = [e for e, c in zip(launch, corr.tolist(), strict=True) if c >= 0]
                corr = corr[corr >= 0]
            put("l_corr", corr)
            put("l_ts", _f64([e.ts for e in launch]))
            put("l_dur", _f64([e.dur for e in launch]))
            put("l_name", self._ids(names, [e.name for e in launch]))
            self._launch.clear()
        for kind, host in enumerate((self._ops, self._rest)):
            if not host:
                continue
            put("h_ts", _f64([e.ts for e in host]))
            put("h_dur", _f64([e.dur for e in host]))
            put("h_name", self._ids(names, [e.name for e in host]))
            put("h_pid", self._ids(self.pid_raw, [e.pid for e in host], self.pids))
            if kind == 0:
                put("h_kind", np.zeros(len(host), dtype=np.int64))
                put("o_tid", self._ids(self.tid_raw, [e.tid for e in host], self.tids))
            else:
                put("h_kind", _i64([1 if e.cat in ANNOTATION_CATS else 2 for e in host]))
            host.clear()

    def finish(self, path: Path, meta: dict[str, Any], index: int, reader: str) -> RankTrace:
        """The RankTrace of the file: columns, steps, CPU op totals, rank and devices.

        Args:
            path: The file.
            meta: Its top-level keys other than traceEvents (see ``records.keep_meta``).
            index: The file's position among the ranks (the rank of last resort).
            reader: Which path read it ("fast" or "lenient").
        """
        host_cat_index = {c: i for i, c in enumerate(HOST_CATEGORIES)}
        names = list(self.names)
        pids = list(self.pids)
        f64, i64 = np.float64, np.int64
        # GPU activities, sorted by start (stable, as the general path sorts them); MTIA
        # records without a stream are not device work (HTA's rule), the others are kernels
        g_ts = self._col("g_ts", f64)
        g_kind = self._col("g_kind", i64)
        g_stream = self._col("g_stream", i64)
        mtia = g_kind == _MTIA
        if mtia.any():
            g_kind = np.where(mtia, 0, g_kind)
            order = np.flatnonzero(~(mtia & (g_stream < 0)))
            order = order[np.argsort(g_ts[order], kind="stable")]
        else:
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
        o_tid = self._col("o_tid", i64)
        n_names = len(names)
        step_no = np.full(n_names, -1, dtype=np.int64)
        cat_op = np.full(n_names, -1, dtype=np.int64)
        cat_ann = np.full(n_names, -1, dtype=np.int64)
        for i in np.flatnonzero(np.bincount(h_name, minlength=n_names)).tolist():
            name = names[i]
            if name.startswith("ProfilerStep"):
                m = STEP_RE.match(name)
                if m:
                    step_no[i] = int(m.group(1))
                    continue
            c = classify(name, "cpu_op")
            cat_op[i] = -1 if c is None else host_cat_index[c]
            c = classify(name, "user_annotation")
            cat_ann[i] = -1 if c is None else host_cat_index[c]
        is_step = step_no[h_name] >= 0
        steps = []
        for j in np.flatnonzero(is_step).tolist():
            ts = float(h_ts[j])
            steps.append((int(step_no[h_name[j]]), ts, ts + float(h_dur[j]), pids[int(h_pid[j])]))
        ops = ops_all = np.flatnonzero(h_kind == 0)
        # ops are the first rows of each run: h_kind 0 rows in order are the o_tid rows
        ops = ops[~is_step[ops] & ~nested_duplicate(h_ts[ops], h_dur[ops], h_name[ops], o_tid)]
        # data loading (enumerate(DataLoader/DataPipe)) is the loader's time, not an op's
        ops = ops[cat_op[h_name[ops]] != host_cat_index["data"]]
        cpu_ops: dict[str, list[float]] = {}
        if len(ops):
            op_names = h_name[ops]
            calls = np.bincount(op_names, minlength=n_names)
            inclusive = np.bincount(op_names, weights=h_dur[ops], minlength=n_names)
            first = np.full(n_names, len(ops), dtype=np.int64)
            np.minimum.at(first, op_names, np.arange(len(ops)))
            used = np.flatnonzero(calls)
            used = used[np.argsort(first[used], kind="stable")]
            cpu_ops = {names[i]: [int(calls[i]), float(inclusive[i])] for i in used.tolist()}
        modules = _module_times(names, h_name, h_kind, h_dur)
        mem = {
            k: self._col(f"m_{k}", f64 if k == "ts" else i64)
            for k in ("ts", "addr", "size", "device_type", "device_id", "allocated", "reserved")
        }
        m_tid = self._col("m_tid", i64)
        mem["op"] = np.full(len(m_tid), -1, dtype=np.int64)
        if len(m_tid) and len(ops_all):
            inner = innermost(
                h_ts[ops_all], h_ts[ops_all] + h_dur[ops_all], o_tid, mem["ts"], m_tid
            )
            mem["op"] = np.where(inner >= 0, h_name[ops_all][inner], -1)
        host_cat = np.where(h_kind == 0, cat_op[h_name], np.where(h_kind == 1, cat_ann[h_name], -1))
        host_cat[is_step] = -1
        keep = np.flatnonzero(host_cat >= 0)
        cols = Columns(
            names=names,
            gpu_ts=g_ts[order],
            gpu_dur=self._col("g_dur", f64)[order],
            gpu_stream=g_stream[order],
            gpu_corr=self._col("g_corr", i64)[order],
            gpu_name=self._col("g_name", i64)[order],
            gpu_kind=g_kind[order],
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
        out = RankTrace(path, cols)
        out.steps = sorted(steps, key=lambda s: s[1])
        out.cpu_ops = cpu_ops
        out._self_times = partial(
            self_times, h_ts[ops_all], h_dur[ops_all], o_tid, h_name[ops_all], n_names
        )
        out.memory_columns = mem
        out.modules = modules
        out.events = self.events
        out.skipped = self.skipped
        out.meta = meta
        out.reader = reader
        apply_meta(out, index)
        return out


def _f64(values: Any) -> Any:
    """A float64 array, converted in C (``array.array`` took 6% of a report's instructions)."""
    return np.fromiter(values, np.float64, len(values))


def _i64(values: Any, n: int | None = None) -> Any:
    """An int64 array, converted in C (see `_f64`)."""
    return np.fromiter(values, np.int64, len(values) if n is None else n)


def nested_duplicate(ts: Any, dur: Any, name: Any, thread: Any) -> Any:
    """Which ops torch merges into their parent: the only child of a same-name op, same thread.

    Torch's profiler (``EventList._remove_dup_nodes``) and the TensorBoard plugin count an op
    that re-enters itself (``aten::mm`` calling ``aten::mm`` as its only child) as one call,
    timed by the outer one. Under proper nesting, sorted by (thread, start, -end), a parent with
    one child is directly followed by it, and its descendants are the ops starting before its
    end: so the child is merged when the parent's descendants are the child and the child's own.

    Returns:
        A bool mask over the ops (True: merged into the parent, not counted).
    """
    n = len(ts)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    end = ts + dur
    order = np.lexsort((-end, ts, thread))
    t, e, nm, th = ts[order], end[order], name[order], thread[order]
    cand = np.flatnonzero((nm[1:] == nm[:-1]) & (th[1:] == th[:-1]) & (e[1:] <= e[:-1])) + 1
    if not len(cand):
        return out
    # ops of the same thread starting before an op's end: its descendants (and itself)
    cuts = [0, *(np.flatnonzero(th[1:] != th[:-1]) + 1).tolist(), n]
    below = np.empty(n, dtype=np.int64)
    for a, b in pairwise(cuts):
        below[a:b] = a + np.searchsorted(t[a:b], e[a:b], side="left")
    desc = below - np.arange(n) - 1
    parent = cand - 1
    merged = cand[desc[parent] == 1 + desc[cand]]
    out[order[merged]] = True
    return out


def self_times(ts: Any, dur: Any, thread: Any, name: Any, n_names: int) -> Any:
    """Self time (us) per name index: each op's duration less its direct children's.

    An op's parent is the last op of its thread, in order of start (the longer first), that
    has not ended by its start: the innermost enclosing one, as a sweep with a stack finds it
    (torch's ``self_cpu_time_total``). Found for all ops at once by a descent over block
    maxima of the ends (``log2(n)`` vectorised steps), as `innermost` does.
    """
    n = len(ts)
    if not n:
        return np.zeros(n_names)
    end = ts + dur
    order = np.lexsort((-end, ts, thread))
    s, e, th = ts[order], end[order], thread[order]
    lo = np.searchsorted(th, th, side="left")  # each op's thread's first index
    q = _last_open(e, np.arange(n) - 1, lo, s, ended_at=True)  # the parent is at q or before
    has = (q >= lo) & (e[np.clip(q, 0, n - 1)] > s)
    d = dur[order]
    children = np.bincount(q[has], weights=d[has], minlength=n)
    return np.bincount(name[order], weights=np.maximum(0.0, d - children), minlength=n_names)


MODULE_PREFIX = "nn.Module: "
"""How torch names a module's forward in a ``with_modules``/``with_stack`` trace."""


def _module_times(names: list[str], name: Any, kind: Any, dur: Any) -> dict[str, list[float]]:
    """Module (``nn.Module: Linear_0``) -> [calls, inclusive host us] (python_function spans)."""
    is_module = np.array([n.startswith(MODULE_PREFIX) for n in names], dtype=bool)
    if not is_module.any():
        return {}
    sel = np.flatnonzero(is_module[name] & (kind == 1))
    calls = np.bincount(name[sel], minlength=len(names))
    tot = np.bincount(name[sel], weights=dur[sel], minlength=len(names))
    return {
        names[i][len(MODULE_PREFIX) :]: [int(calls[i]), float(tot[i])]
        for i in np.flatnonzero(calls).tolist()
    }


def innermost(start: Any, end: Any, thread: Any, t: Any, t_thread: Any) -> Any:
    """Index of the innermost span of the same thread holding each time (-1: none).

    Spans nest on a thread, so the innermost one holding ``t`` is the last, in order of start,
    that starts at or before ``t`` and ends at or after it: most often the last to start by
    ``t`` (an allocation is made inside the op that runs last). For the other times, a descent
    over block maxima of the span ends (``log2(n)`` vectorised steps) to the last not yet ended.
    """
    n = len(start)
    out = np.full(len(t), -1, dtype=np.int64)
    if not n:
        return out
    order = np.lexsort((-end, start, thread))
    s, e, th = start[order], end[order], thread[order]
    lo = np.searchsorted(th, t_thread, side="left")
    p = np.empty(len(t), dtype=np.int64)
    for thread_id in set(t_thread.tolist()):
        on = t_thread == thread_id
        a, b = int(lo[on][0]), int(np.searchsorted(th, thread_id, side="right"))
        p[on] = a + np.searchsorted(s[a:b], t[on], side="right") - 1
    started = p >= lo
    hit = started & (e[np.clip(p, 0, n - 1)] >= t)
    rest = np.flatnonzero(started & ~hit)
    if len(rest):
        p[rest] = q = _last_open(e, p[rest], lo[rest], t[rest], ended_at=False)
        hit[rest] = (q >= lo[rest]) & (e[np.clip(q, 0, n - 1)] >= t[rest])
    out[hit] = order[p[hit]]
    return out


def _last_open(e: Any, q: Any, lo: Any, t: Any, ended_at: bool) -> Any:
    """Each ``q`` moved back to the last index, down to ``lo``, whose span is open at ``t``.

    Open: its end ``e`` is after ``t`` (or at it, unless ``ended_at``). Below ``lo`` where none
    is. A descent over block maxima of the ends (``log2(n)`` vectorised steps).
    """
    n = len(e)
    levels = [e]  # level k holds max(e[i - 2**k + 1 .. i])
    while (1 << len(levels)) <= n:
        prev, w = levels[-1], 1 << (len(levels) - 1)
        cur = prev.copy()
        cur[w:] = np.maximum(prev[w:], prev[:-w])
        levels.append(cur)
    for k in range(len(levels) - 1, -1, -1):
        w = 1 << k
        ends = levels[k][np.clip(q, 0, n - 1)]
        jump = (q - w + 1 >= lo) & ((ends <= t) if ended_at else (ends < t))
        q = np.where(jump, q - w, q)
    return q


def _pid_text(pid: Any) -> str:
    """A pid as text (the JSON text of a number, a string as it is): 1 and "1" are one pid."""
    return pid if isinstance(pid, str) else json.dumps(pid)
