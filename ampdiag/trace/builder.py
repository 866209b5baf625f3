"""Columns from decoded trace events: what the fast reader keeps, chunk by chunk.

The fast reader (:mod:`ampdiag.trace.fastread`) hands each decoded chunk to a
:class:`ColumnBuilder`, which routes the complete events by category (GPU activity, launch
call, host op, other host event) and appends their fields as compact columns
(``array.array``, so that a worker process of :mod:`ampdiag.trace.parallel` never imports
numpy). ``finish`` turns them into :class:`~ampdiag.trace.columns.Columns` and the steps and
CPU-op totals of a :class:`~ampdiag.trace.reader.RankTrace`; ``state`` / ``absorb`` carry the
columns of a part read by another process into this one.
"""

from __future__ import annotations

import json
import re
from array import array
from typing import Any

from ampdiag.trace.reader import (
    ANNOTATION_CATS,
    HOST_OP_CATS,
    KERNEL_CATS,
    LAUNCH_CATS,
    MEMCPY_CATS,
    MEMSET_CATS,
    RankTrace,
)
from ampdiag.trace.step_breakdown import classify

BuilderState = tuple[int, list[str], dict[Any, int], list[str], dict[str, list[Any]]]
"""(events read, names, raw pid -> id, pid texts, column name -> arrays): see ``state``."""

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
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")


class ColumnBuilder:
    """Accumulates the columns of decoded events, chunk by chunk.

    Args:
        complete: The class of a complete ("X") event; ``add`` keeps events of this class only.
            Such an event has ``name``, ``cat``, ``ts``, ``dur``, ``pid`` and ``args`` (None,
            or with ``stream`` and ``correlation``; -1 when absent). None for a builder that
            only absorbs what others read.
    """

    def __init__(self, complete: type | None, scanner: Any = None) -> None:
        self.complete = complete
        # the compiled scanner (ampdiag.trace._kscan.Scanner) when it reads instead of `add`
        self.scanner = scanner
        self.names: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.pid_raw: dict[Any, int] = {}
        self.events = 0
        # column name -> arrays, one per chunk: g_* GPU activities, l_* launch calls, h_* host
        # events (h_kind 0: op such as cpu_op, 1: annotation, 2: any other category)
        self.parts: dict[str, list[Any]] = {}
        # per-chunk groups, emptied after each chunk; routed by category
        self._gpu: list[Any] = []
        self._launch: list[Any] = []
        self._ops: list[Any] = []
        self._rest: list[Any] = []
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
        complete: Any = self.complete
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

    def state(self) -> BuilderState:
        """What `absorb` takes: the events read, the name and pid tables and the columns."""
        if self.scanner is not None:
            return _scanned_state(self.scanner.state())
        return self.events, list(self.names), self.pid_raw, list(self.pids), self.parts

    def absorb(self, state: BuilderState) -> None:
        """Appends the columns of the part read after this one (see `state`).

        Its names and pids are renumbered into this builder's tables, which then list them in
        the order one reader of the whole file would have met them.
        """
        import numpy as np

        self._take_scanned()  # this builder's own part first
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

    def _take_scanned(self) -> None:
        """Moves what the compiled scanner read into this builder's own tables and parts."""
        if self.scanner is not None:
            scanned, self.scanner = self.state(), None
            self.absorb(scanned)

    def finish(self, out: RankTrace) -> None:
        """Puts the columns, steps and CPU op totals into ``out``."""
        import numpy as np

        from ampdiag.trace.columns import HOST_CATEGORIES, Columns

        self._take_scanned()

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


SCANNER_GROUPS = {"kernel": 0, "memcpy": 1, "memset": 2, "launch": 3, "op": 4, "annotation": 5}
"""The compiled scanner's group codes (any other category: 6, a host event of its own)."""


def scanner_groups() -> dict[bytes, int]:
    """Category (UTF-8) -> the compiled scanner's group code, from the reader's categories."""
    kinds = ("kernel", "memcpy", "memset")
    groups = {cat.encode(): SCANNER_GROUPS[kinds[kind]] for cat, kind in _KIND.items()}
    groups.update(dict.fromkeys([c.encode() for c in LAUNCH_CATS], SCANNER_GROUPS["launch"]))
    groups.update(dict.fromkeys([c.encode() for c in HOST_OP_CATS], SCANNER_GROUPS["op"]))
    annotations = [c.encode() for c in ANNOTATION_CATS]
    groups.update(dict.fromkeys(annotations, SCANNER_GROUPS["annotation"]))
    return groups


def _scanned_state(scanned: tuple[int, list[Any], list[str], dict[str, bytes]]) -> BuilderState:
    """The compiled scanner's state as `ColumnBuilder.state` gives it (names' escapes decoded)."""
    events, names, pids, columns = scanned
    decoded = [json.loads(f'"{n[0]}"') if isinstance(n, tuple) else n for n in names]
    return events, decoded, {}, pids, {key: [data] for key, data in columns.items()}
