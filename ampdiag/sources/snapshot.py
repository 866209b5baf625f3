"""Summaries of CUDA allocator snapshots (``torch.cuda.memory._snapshot()``), pure Python.

The snapshot format is torch's documented one (torch/cuda/memory.py, "Understanding CUDA
Memory Usage"): ``{"segments": [Segment], "device_traces": [[TraceEntry]]}`` where a Segment
has ``address, total_size, allocated_size, blocks: [{address, size, state, frames}]`` and a
TraceEntry has ``action`` (alloc, free_requested, free_completed, segment_alloc, segment_free,
segment_map, segment_unmap, oom, snapshot), ``addr``, ``size``, ``frames`` and, for ``oom``,
``device_free``. The summary replays the trace from the state it implies at its start to find
the peak of allocated bytes, what was live then (by stack and by category), the reserved bytes
at that moment, and what was live at each OOM. It stays small: it goes into session.json.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ampdiag.errors import InputError

TOP_SITES = 10
#: OOMs described with what was live at each (the others are counted).
MAX_OOMS = 20
#: Longest text kept from a frame field.
MAX_TEXT = 500
_INT_LIMIT = 2**63
FRAMES_PER_SITE = 6
MAX_POINTS = 400
_INTERNAL = ("/torch/", "<frozen", "/site-packages/", "/dist-packages/", "/lib/python3", "??")
"""Path parts of Python frames that are not the user's (``\\`` read as ``/``)."""


#: The integer fields the summary reads, per kind of record: sizes and addresses, which a
#: real snapshot holds as integers in [0, 2^63).
_SEGMENT_INTS = ("address", "total_size", "allocated_size")
_BLOCK_INTS = ("address", "size")
_TRACE_INTS = ("addr", "size", "device_free")


def check_snapshot(snap: Any) -> dict[str, Any]:
    """Returns the snapshot if it has torch's shape, else raises InputError naming the key.

    Every record the summary reads is checked first (one pass, bounded by what the safe
    unpickler let through): segments, their blocks and the trace entries are objects, and the
    sizes and addresses among their fields are integers in [0, 2^63). A field of another type
    or out of that range is refused, never read as 0 into a report that looks right.
    """
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise InputError("not a PyTorch CUDA memory snapshot: no 'segments' list")
    traces = snap.get("device_traces", [])
    if not isinstance(traces, list):
        raise InputError("not a PyTorch CUDA memory snapshot: 'device_traces' is not a list")
    for i, segment in enumerate(snap["segments"]):
        _check_record(segment, f"segments[{i}]", _SEGMENT_INTS)
        blocks = segment.get("blocks", [])
        if not isinstance(blocks, list):
            _refuse(f"segments[{i}].blocks", "expected a list", blocks)
        for j, block in enumerate(blocks):
            _check_record(block, f"segments[{i}].blocks[{j}]", _BLOCK_INTS)
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            _refuse(f"device_traces[{d}]", "expected a list", trace)
        for k, entry in enumerate(trace):
            _check_record(entry, f"device_traces[{d}][{k}]", _TRACE_INTS)
    return snap


def _check_record(record: Any, where: str, ints: tuple[str, ...]) -> None:
    if not isinstance(record, dict):
        _refuse(where, "expected an object", record)
    for key in ints:
        value = record.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            _refuse(f"{where}.{key}", "expected an integer", value)
        if not 0 <= value < _INT_LIMIT:
            digits = len(str(abs(value))) if abs(value) < 10**4000 else "over 4000"
            raise InputError(
                f"not a PyTorch CUDA memory snapshot: {where}.{key}: an integer out of range "
                f"[0, 2^63) ({'-' if value < 0 else ''}{digits} digits)"
            )


def _refuse(where: str, expected: str, value: Any) -> None:
    raise InputError(
        f"not a PyTorch CUDA memory snapshot: {where}: {expected}, got {type(value).__name__}"
    )


def _int(value: Any) -> int:
    """An integer field as an int; anything else (a list, text, a 5000-digit number) is 0.

    A snapshot is untrusted input: its numbers must stay numbers JSON can print.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -_INT_LIMIT < value < _INT_LIMIT else 0
    if isinstance(value, float) and math.isfinite(value) and abs(value) < _INT_LIMIT:
        return int(value)
    return 0


def _text(value: Any) -> str:
    """A text field, capped; never ``str()`` of a container.

    A pickle's shared references can make a tiny file a container whose text doubles at each
    level.
    """
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(_int(value)) if isinstance(value, int) else f"{value:g}"
    return "?"


def _frame_text(frame: Any) -> str:
    if not isinstance(frame, dict):
        return _text(frame)
    name = _text(frame.get("filename", "?"))
    short = "/".join(name.replace("\\", "/").split("/")[-2:])
    return f"{short}:{_text(frame.get('line', '?'))} {_text(frame.get('name', '?'))}"


def site_of(frames: Any) -> tuple[str, ...]:
    """The allocation site: the user's Python frames, innermost first (``file:line function``).

    Torch, c10, the allocator, the standard library and site-packages are skipped, and so are
    C++ frames (a snapshot recorded with ``stacks="all"`` starts every stack with the
    allocator's own: ``gather_with_cpp``, ``DeviceCachingAllocator::malloc``). An allocation with
    no Python frame of the user's (the autograd engine's thread, say) is named by its autograd
    node or op instead.
    """
    if not isinstance(frames, list):
        return ("<no stack recorded>",)
    dicts = [f for f in frames if isinstance(f, dict)]
    user = [f for f in dicts if _is_user(f)]
    if user:
        return tuple(_frame_text(f) for f in user[:FRAMES_PER_SITE])
    if not dicts:
        return ("<no stack recorded>",)
    node = _autograd_node(dicts)
    if node:
        return (f"<backward: {node}>",)
    python = [f for f in dicts if _is_python(f)]
    if python:  # only library frames: the outermost is where the library was called
        return tuple(_frame_text(f) for f in python[-FRAMES_PER_SITE:])
    return ("<no Python frame recorded>",)


_OP = re.compile(r"^at::_ops::(\w+)::call\b")
_NODE = re.compile(r"^torch::autograd::generated::(\w+)::apply\b")


def op_of(frames: Any) -> str | None:
    """The op that allocated, as the stack names it; None when it names none.

    The outermost ``at::_ops::<op>::call`` (the op the caller called, not the
    ``empty_strided`` it made its output with), else the innermost torch Python function.
    """
    if not isinstance(frames, list):
        return None
    dicts = [f for f in frames if isinstance(f, dict)]
    ops = [m.group(1) for f in dicts if (m := _OP.match(_text(f.get("name", ""))))]
    if ops:
        return f"aten::{ops[-1]}"
    for f in dicts:
        if _is_python(f) and not _is_user(f):
            return _text(f.get("name", "?"))
    return None


def _autograd_node(frames: list[dict[str, Any]]) -> str | None:
    for f in frames:
        m = _NODE.match(_text(f.get("name", "")))
        if m:
            return m.group(1)
    return None


def _is_python(frame: Mapping[str, Any]) -> bool:
    return _text(frame.get("filename", "")).endswith(".py")


def _is_user(frame: Mapping[str, Any]) -> bool:
    """A Python frame of the user's code (not torch, a library or the standard library)."""
    return _is_python(frame) and not _is_internal(frame)


def _is_internal(frame: Mapping[str, Any]) -> bool:
    name = _text(frame.get("filename", "")).replace("\\", "/")
    return any(s in name for s in _INTERNAL) and "ampdiag" not in name


def _group(live: Mapping[int, tuple[int, Any]], known: Mapping[int, str]) -> dict[str, Any]:
    """What is live, grouped by the first frame in user code and the op (``top_sites``)."""
    sites: dict[tuple[str, str | None], list[Any]] = {}
    cats: dict[str, int] = {}
    for addr, (size, frames) in live.items():
        where = site_of(frames)
        key = (where[0], op_of(frames))
        s = sites.setdefault(key, [0, 0, where])
        s[0] += size
        s[1] += 1
        cat = known.get(addr, "other")
        cats[cat] = cats.get(cat, 0) + size
    top = sorted(sites.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return {
        "top_sites": [
            {"bytes": b, "count": n, "site": site, "op": op, "frames": list(where)}
            for (site, op), (b, n, where) in top
        ],
        "by_category": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
    }


def _device_index(snap: Mapping[str, Any]) -> int:
    traces = snap.get("device_traces") or []
    sizes = [len(t) if isinstance(t, list) else 0 for t in traces]
    best = max(range(len(sizes)), key=lambda i: sizes[i], default=0)
    if sizes and sizes[best]:
        return best
    devices = [_int(s.get("device", 0)) for s in snap["segments"] if isinstance(s, dict)]
    return devices[0] if devices else 0


def summarize_snapshot(
    snap: Mapping[str, Any], known: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """The small JSON summary of a snapshot (see the module docstring).

    Args:
        snap: A snapshot in torch's format.
        known: Block address -> category ("parameters", "gradients", "optimizer_state") for the
            tensors ampdiag knows; other live blocks count as "other".

    Returns:
        ``device, segments, allocated_bytes, reserved_bytes`` (at the snapshot),
        ``peak {allocated_bytes, reserved_bytes, fragmentation_bytes, top_sites, by_category}``,
        ``ooms [...]`` with what was live at each, ``timeline`` and ``trace_events``.
    """
    check_snapshot(snap)
    known = dict(known or {})
    device = _device_index(snap)
    segments = [
        s
        for s in snap["segments"]
        if isinstance(s, dict) and _int(s.get("device", device)) == device
    ]
    reserved_end = sum(_int(s.get("total_size", 0)) for s in segments)
    end_live = _live_blocks(segments)
    allocated_end = sum(size for size, _ in end_live.values())
    traces = snap.get("device_traces") or []
    chosen = traces[device] if 0 <= device < len(traces) else []
    trace = [e for e in (chosen if isinstance(chosen, list) else []) if isinstance(e, dict)]

    # The state at the trace's start: end state minus what the trace did.
    d_alloc = sum(_effect(e)[0] for e in trace)
    d_res = sum(_effect(e)[1] for e in trace)
    allocated_in_trace = {_int(e.get("addr", 0)) for e in trace if e.get("action") == "alloc"}
    start = (allocated_end - d_alloc, reserved_end - d_res)
    before = {a: v for a, v in end_live.items() if a not in allocated_in_trace}
    ooms_at = [i for i, e in enumerate(trace) if e.get("action") == "oom"]

    points, _ = _replay(trace, before, start, set(), known)
    peak_i = max(range(len(points)), key=lambda i: points[i][0])
    # What was live at the peak (after event peak_i - 1) and at each described OOM (before
    # it): one more pass, however many OOMs (each described OOM costs one grouping).
    described = ooms_at[:MAX_OOMS]
    _, groups = _replay(trace, before, start, {peak_i, *described}, known)
    peak_alloc, peak_res = points[peak_i]
    peak = {
        "allocated_bytes": peak_alloc,
        "reserved_bytes": peak_res,
        "fragmentation_bytes": max(0, peak_res - peak_alloc),
        "event_index": peak_i - 1,
        **groups[peak_i],
    }
    ooms = [
        {
            "event_index": i,
            "requested_bytes": _int(trace[i].get("size", 0)),
            "device_free_bytes": _int(trace[i].get("device_free", 0)),
            "allocated_bytes": points[i][0],
            "reserved_bytes": points[i][1],
            "frames": list(site_of(trace[i].get("frames"))),
            **groups[i],
        }
        for i in described
    ]
    step = max(1, len(points) // MAX_POINTS)
    idx = list(range(0, len(points), step))
    if peak_i not in idx:
        idx = sorted([*idx, peak_i])
    return {
        "device": device,
        "segments": len(segments),
        "allocated_bytes": allocated_end,
        "reserved_bytes": reserved_end,
        "trace_events": len(trace),
        "trace_starts_empty": start[0] == 0,
        "peak": peak,
        "ooms": ooms,
        "oom_count": len(ooms_at),
        "timeline": {
            "event": idx,
            "allocated": [points[i][0] for i in idx],
            "reserved": [points[i][1] for i in idx],
        },
    }


def _live_blocks(segments: list[dict[str, Any]]) -> dict[int, tuple[int, Any]]:
    """Address -> (size, frames) of every block allocated at the snapshot."""
    live: dict[int, tuple[int, Any]] = {}
    for seg in segments:
        blocks = seg.get("blocks")
        for b in blocks if isinstance(blocks, list) else []:
            if isinstance(b, dict) and b.get("state") == "active_allocated":
                live[_int(b.get("address", 0))] = (_int(b.get("size", 0)), b.get("frames"))
    return live


def _effect(e: Mapping[str, Any]) -> tuple[int, int]:
    """What a trace event does to (allocated, reserved) bytes."""
    act, size = e.get("action"), _int(e.get("size", 0))
    if act == "alloc":
        return size, 0
    if act == "free_completed":
        return -size, 0
    if act in ("segment_alloc", "segment_map"):
        return 0, size
    if act in ("segment_free", "segment_unmap"):
        return 0, -size
    return 0, 0


def _replay(
    trace: list[dict[str, Any]],
    before: Mapping[int, tuple[int, Any]],
    start: tuple[int, int],
    wanted: set[int],
    known: Mapping[int, str],
) -> tuple[list[tuple[int, int]], dict[int, dict[str, Any]]]:
    """One pass over the trace: (allocated, reserved) after each event, and more.

    Also what was live just before each event index in ``wanted`` (grouped; an index of
    ``len(trace)`` means at the end). ``before``: the blocks live at the trace's start.
    """
    live = dict(before)
    alloc, res = start
    points = [(alloc, res)]
    groups: dict[int, dict[str, Any]] = {}
    for i, e in enumerate(trace):
        if i in wanted:
            groups[i] = _group(live, known)
        da, dr = _effect(e)
        alloc, res = alloc + da, res + dr
        act, addr = e.get("action"), _int(e.get("addr", 0))
        if act == "alloc":
            live[addr] = (_int(e.get("size", 0)), e.get("frames"))
        elif act == "free_completed":
            live.pop(addr, None)
        points.append((alloc, res))
    if len(trace) in wanted:
        groups[len(trace)] = _group(live, known)
    return points, groups


def session_from_snapshot(path: Path) -> Any:
    """A Session holding only the memory section of a snapshot pickle (safely unpickled)."""
    from ampdiag.session import Session
    from ampdiag.sources.safe_pickle import load_plain

    snap = check_snapshot(load_plain(path))
    try:
        summary = summarize_snapshot(snap)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        # Plain data of the wrong shape somewhere inside: bad input, not a bug of ours.
        raise InputError(
            f"{path.name}: not a PyTorch CUDA memory snapshot ({type(exc).__name__})"
        ) from None
    return Session(
        environment={"device_type": "cuda", "source": str(path)},
        sections={"memory": {"device": "cuda", "cuda": summary, "snapshot_file": path.name}},
    )
