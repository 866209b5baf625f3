"""Categorized memory timelines: the peak, per-step peaks, thinning, and a fallback categorizer.

A timeline is ``{"t_us": [...], "bytes": {category: [...]}, "steps": [(name, start, end)],
"source": str}``: after each allocator event, the bytes live in each category. torch's memory
profiler makes one (`ampdiag.compat.memory.categorized_timeline`); when it is unavailable,
`timeline_from_trace` makes one from the public Kineto trace's ``[memory]`` events and the
tensors ampdiag knows from the live run (the trace read by `ampdiag.trace.reader`):

* an allocation at the address of a known parameter / gradient / optimizer-state tensor, live
  at the end of the step where that tensor was seen, takes that tensor's category;
* an allocation made in a step whose saved tensors were counted (``saved_by_step``) is an
  activation when it was live as the step's backward began (where they were counted) and
  autograd saved a storage of its address and size for the backward, else a temporary (a
  weight's autocast copy is a temporary);
* without that count, an allocation made before the step's backward began and still live
  after it is an activation (autograd kept it for the backward);
* everything else is a temporary.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from ampdiag.trace.columns import HOST_CATEGORIES
from ampdiag.trace.records import RankTrace

#: Our memory category names, in plot order (bottom first).
CATEGORIES: tuple[str, ...] = (
    "parameters",
    "optimizer_state",
    "gradients",
    "inputs",
    "activations",
    "temporaries",
    "autograd_detail",
    "unknown",
)
#: The profiler event the memory collector leaves where it counted a backward's saved tensors.
SAVED_MARK = "ampdiag::saved_tensors_counted"
MAX_POINTS = 400


def totals(tl: Mapping[str, Any]) -> list[int]:
    """Total bytes at each point of a timeline."""
    cols = [tl["bytes"][c] for c in tl["bytes"]]
    n = len(tl["t_us"])
    return [sum(col[i] for col in cols) for i in range(n)]


def peak(tl: Mapping[str, Any]) -> dict[str, Any] | None:
    """The point with the most bytes live: its time, total and split by category."""
    tot = totals(tl)
    if not tot:
        return None
    i = max(range(len(tot)), key=tot.__getitem__)
    return {
        "bytes": tot[i],
        "t_us": tl["t_us"][i],
        "by_category": {c: int(v[i]) for c, v in tl["bytes"].items()},
        "step": step_at(tl, tl["t_us"][i]),
    }


def activation_peak(tl: Mapping[str, Any]) -> dict[str, Any] | None:
    """The point with the most activation bytes live: its total and its activations.

    With the overall `peak` it bounds the peak at another batch size (each point's activations
    scale with the batch; see `ampdiag.analysis.memory_estimates.estimate_peak`).
    """
    acts = tl["bytes"].get("activations") or []
    if not acts or max(acts) <= 0:
        return None
    i = max(range(len(acts)), key=acts.__getitem__)
    return {
        "bytes": sum(int(v[i]) for v in tl["bytes"].values()),
        "activations": int(acts[i]),
        "gradients": int((tl["bytes"].get("gradients") or [0] * len(acts))[i]),
        "t_us": tl["t_us"][i],
        "step": step_at(tl, tl["t_us"][i]),
    }


def step_at(tl: Mapping[str, Any], t_us: float) -> str | None:
    """The name of the profiler step (``ProfilerStep#N``) that contains ``t_us``."""
    for name, start, end in tl.get("steps", []):
        if start <= t_us <= end:
            return str(name)
    return None


def step_peaks(tl: Mapping[str, Any], category: str) -> dict[str, int]:
    """Per profiler step: the most bytes of one category live at once."""
    out: dict[str, int] = {}
    values = tl["bytes"].get(category, [])
    for name, start, end in tl.get("steps", []):
        inside = [v for t, v in zip(tl["t_us"], values, strict=False) if start <= t <= end]
        if inside:
            out[str(name)] = int(max(inside))
    return out


def thin(tl: Mapping[str, Any], max_points: int = MAX_POINTS) -> dict[str, Any]:
    """At most ``max_points`` points, keeping in each bucket the point with the most bytes."""
    n = len(tl["t_us"])
    out = dict(tl)
    if n <= max_points:
        return out
    tot = totals(tl)
    width = n / max_points
    keep = []
    for b in range(max_points):
        lo, hi = int(b * width), max(int((b + 1) * width), int(b * width) + 1)
        keep.append(max(range(lo, min(hi, n)), key=tot.__getitem__))
    out["t_us"] = [tl["t_us"][i] for i in keep]
    out["bytes"] = {c: [v[i] for i in keep] for c, v in tl["bytes"].items()}
    return out


# --- fallback: our own categorization from the Kineto trace ------------------------------------


def timeline_from_trace(
    trace: RankTrace,
    device_type: int,
    known_by_step: Mapping[int, Mapping[int, str]],
    known_sizes: Mapping[int, int] | None = None,
    saved_by_step: Mapping[int, Mapping[tuple[int, int], str]] | None = None,
) -> dict[str, Any] | None:
    """Categorizes the trace's ``[memory]`` events with the known tensors (module docstring).

    Args:
        trace: The Kineto trace, read by the trace reader (its ``memory`` events, steps and
            backward host spans).
        device_type: 0 for CPU allocations, 1 for CUDA (the trace's ``Device Type``).
        known_by_step: Step index -> {storage address: category} seen at the end of that step.
        known_sizes: Storage address -> bytes of those tensors. A known tensor with no event
            in the trace was live throughout it (allocated before, freed after) and is counted
            from the start.
        saved_by_step: Step index -> {(storage address, bytes): category} of the storages
            autograd saved in that step (activations, or temporaries for parameters' copies).

    Returns:
        A timeline (source ``"ampdiag-known-tensors"``), or None without memory events.
    """
    mem = sorted((e for e in trace.memory if e[3] == device_type), key=lambda e: e[0])
    if not mem:
        return None
    steps = [(f"ProfilerStep#{n}", start, end) for n, start, end, _pid in trace.steps]
    host = trace.columns()
    backward = sorted(host.host_start[host.host_cat == HOST_CATEGORIES.index("backward")].tolist())
    t0 = min([mem[0][0]] + [s[1] for s in steps])
    intervals = _allocations(mem, known_by_step, known_sizes or {})
    classify = _Classifier(steps, backward, known_by_step, saved_by_step or {})
    times, cols = _series(intervals, classify, t0)
    return {
        "t_us": times,
        "bytes": cols,
        "steps": [(n, s - t0, e - t0) for n, s, e in steps],
        "source": "ampdiag-known-tensors",
    }


def _allocations(
    mem: list[tuple[float, int, int, int]],
    known_by_step: Mapping[int, Mapping[int, str]],
    known_sizes: Mapping[int, int],
) -> list[list[Any]]:
    """Allocation intervals ``[addr, size, t_alloc, t_free]`` (None: before / after the trace).

    A known tensor with no event in the trace was live throughout it.
    """
    intervals: list[list[Any]] = []
    open_at: dict[int, int] = {}
    for t, addr, size, _device in mem:
        if size > 0:
            open_at[addr] = len(intervals)
            intervals.append([addr, size, t, None])
        elif size < 0:
            j = open_at.pop(addr, None)
            if j is None:
                intervals.append([addr, -size, None, t])  # allocated before the trace began
            else:
                intervals[j][3] = t
    in_trace = {iv[0] for iv in intervals}
    last_known = known_by_step[max(known_by_step)] if known_by_step else {}
    for addr in last_known:
        size = known_sizes.get(addr, 0)
        if addr not in in_trace and size > 0:
            intervals.append([addr, size, None, None])
    return intervals


class _Classifier:
    """The category of one allocation interval (the module docstring's rules)."""

    def __init__(
        self,
        steps: list[tuple[str, float, float]],
        backward: list[float],
        known_by_step: Mapping[int, Mapping[int, str]],
        saved_by_step: Mapping[int, Mapping[tuple[int, int], str]],
    ) -> None:
        self.steps = steps
        self.known_by_step = known_by_step
        self.saved_by_step = saved_by_step
        # each step's first backward, found once (per allocation it made the categorizer
        # quadratic: a step holds thousands of backward ops)
        self.first_bwd: list[float | None] = []
        for _, start, end in steps:
            i = bisect.bisect_left(backward, start)
            self.first_bwd.append(backward[i] if i < len(backward) and backward[i] <= end else None)
        self.step_end = {n: end for name, _, end in steps if (n := step_number(name)) is not None}

    def _step(self, t: float) -> tuple[float | None, Mapping[tuple[int, int], str] | None]:
        """The first backward of the step holding ``t``, and the storages it saved."""
        for k, (name, start, end) in enumerate(self.steps):
            if start <= t <= end:
                n = step_number(name)
                return self.first_bwd[k], self.saved_by_step.get(n) if n is not None else None
        return None, None

    def __call__(self, addr: int, size: int, t_alloc: float | None, t_free: float | None) -> str:
        for step, ptrs in self.known_by_step.items():
            cat = ptrs.get(addr)
            end = self.step_end.get(step)
            if cat is None:
                continue
            live_at_end = end is None or (
                (t_alloc is None or t_alloc <= end) and (t_free is None or t_free >= end)
            )
            if live_at_end:
                return cat
        if t_alloc is None:
            return "temporaries"
        b, labels = self._step(t_alloc)  # the saved tensors were counted just before b
        live = b is not None and t_alloc < b and (t_free is None or t_free > b)
        if labels is not None:
            return labels.get((addr, size), "temporaries") if live else "temporaries"
        return "activations" if live else "temporaries"


def _series(
    intervals: list[list[Any]], classify: _Classifier, t0: float
) -> tuple[list[float], dict[str, list[int]]]:
    """The bytes live per category after each moment (times relative to ``t0``)."""
    deltas: list[tuple[float, str, int]] = []
    for addr, size, t_alloc, t_free in intervals:
        cat = classify(addr, size, t_alloc, t_free)
        deltas.append((t_alloc if t_alloc is not None else t0, cat, size))
        if t_free is not None:
            deltas.append((t_free, cat, -size))
    deltas.sort(key=lambda d: (d[0], d[2]))
    current = dict.fromkeys(CATEGORIES, 0)
    times: list[float] = []
    cols: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    for t, cat, size in deltas:
        current[cat] += size
        rel = t - t0
        if times and times[-1] == rel:
            for c in CATEGORIES:
                cols[c][-1] = current[c]
        else:
            times.append(rel)
            for c in CATEGORIES:
                cols[c].append(current[c])
    return times, cols


def step_number(name: str | None) -> int | None:
    """``"ProfilerStep#3"`` -> 3."""
    if not name or "#" not in name:
        return None
    try:
        return int(name.split("#", 1)[1])
    except ValueError:
        return None


def as_json(tl: Mapping[str, Any]) -> dict[str, Any]:
    """The timeline in its session form (milliseconds, lists only)."""
    return {
        "t_ms": [round(t / 1000, 4) for t in tl["t_us"]],
        "bytes": {c: [int(x) for x in v] for c, v in tl["bytes"].items()},
        "steps": [{"name": n, "start_ms": s / 1000, "end_ms": e / 1000} for n, s, e in tl["steps"]],
        "source": tl.get("source", ""),
    }


# --- the memory view of any trace with [memory] events ------------------------------------------

#: At most this many points of each device's curve are kept: each stretch's lowest and highest
#: (the peak always among them). Under the HTML chart's resolution (``render.charts.MAX_POINTS``),
#: so the curve is drawn as kept, never averaged (an average would lower the peak drawn).
CURVE_POINTS = 200
TOP_OPS = 10
_DEVICE_TYPES = {0: "CPU", 1: "cuda"}


def _device_name(device_type: int, device_id: int) -> str:
    kind = _DEVICE_TYPES.get(device_type, f"device type {device_type}")
    return kind if kind == "CPU" or device_id < 0 else f"{kind}:{device_id}"


def trace_memory(trace: RankTrace) -> dict[str, Any] | None:
    """The memory view of a trace recorded with ``profile_memory=True`` (None without events).

    Per device: the curve of allocated and reserved bytes over the trace (the allocator's own
    ``Total Allocated`` / ``Total Reserved``, else allocated replayed from ``Bytes`` from 0),
    its peak, when it falls and in which ``ProfilerStep``; and the ops that allocate the most
    on the device of the highest peak: the innermost CPU op running when each allocation was
    made (``RankTrace.memory_columns["op"]``), its allocations, bytes allocated, and the bytes
    of those still held at the peak (allocated by then, freed after it or never).
    """
    import numpy as np

    m = trace.memory_columns
    if not m or not len(m["ts"]):
        return None
    ts, addr, size, dtype = m["ts"], m["addr"], m["size"], m["device_type"]
    dev_id, allocated, reserved = m["device_id"], m["allocated"], m["reserved"]
    names = trace.columns().names
    op_index = m["op"]
    t0 = min([float(ts.min())] + [s[1] for s in trace.steps])
    steps = [(f"ProfilerStep#{n}", s - t0, e - t0) for n, s, e, _ in trace.steps]
    devices: list[dict[str, Any]] = []
    pairs = zip(dtype.tolist(), dev_id.tolist(), strict=True)
    for dt, di in sorted(set(pairs)):
        on = np.flatnonzero((dtype == dt) & (dev_id == di))
        on = on[np.argsort(ts[on], kind="stable")]
        t = ts[on]
        alloc = allocated[on]
        source = "Total Allocated"
        if (alloc < 0).any():  # not recorded: replayed from the events' sizes
            alloc, source = np.cumsum(size[on]), "replayed from Bytes"
        res = reserved[on]
        i = int(np.argmax(alloc))
        at = float(t[i]) - t0
        keep = _curve_points(alloc, CURVE_POINTS)
        devices.append(
            {
                "device": _device_name(dt, di),
                "events": len(on),
                "allocated_from": source,
                "t_ms": ((t[keep] - t0) / 1000).tolist(),
                "allocated": alloc[keep].tolist(),
                "reserved": res[keep].tolist() if (res >= 0).all() else [],
                "peak": {
                    "bytes": int(alloc[i]),
                    "t_ms": at / 1000,
                    "step": step_at({"steps": steps}, at),
                    "op": names[int(op_index[on[i]])] if op_index[on[i]] >= 0 else None,
                },
                "peak_reserved": int(res.max()) if (res >= 0).all() else None,
                "_sel": on,
                "_peak_ts": float(t[i]),
            }
        )
    top = max(devices, key=lambda d: d["peak"]["bytes"])
    top_ops = _allocating_ops(ts, addr, size, op_index, names, top.pop("_sel"), top.pop("_peak_ts"))
    for d in devices:
        d.pop("_sel", None)
        d.pop("_peak_ts", None)
    return {
        "devices": devices,
        "top_ops_device": top["device"],
        "top_ops": top_ops,
        "steps": [{"step": n, "start_ms": s / 1000, "end_ms": e / 1000} for n, s, e in steps],
    }


def _curve_points(values: Any, limit: int) -> Any:
    """Indices of at most ``limit`` points: the first, the last, each stretch's min and max."""
    import numpy as np

    n = len(values)
    if n <= limit:
        return np.arange(n)
    stretches = (limit - 2) // 2
    edges = np.linspace(0, n, stretches + 1).astype(np.int64)  # n > stretches: none empty
    of = np.repeat(np.arange(stretches), np.diff(edges))
    keep = np.zeros(n, dtype=bool)
    keep[[0, n - 1]] = True
    for extreme in (np.maximum, np.minimum):
        hit = values == extreme.reduceat(values, edges[:-1])[of]
        # each stretch's first point at its extreme (not np.unique: it imports numpy.ma, 10 ms)
        keep[np.minimum.reduceat(np.where(hit, np.arange(n), n), edges[:-1])] = True
    return np.flatnonzero(keep)


def _allocating_ops(
    ts: Any, addr: Any, size: Any, op: Any, names: Sequence[str], on: Any, peak_ts: float
) -> list[dict[str, Any]]:
    """The ops allocating the most bytes among the events ``on``, with what they hold at the peak.

    An allocation is freed by the next event at its address (on the device) that frees memory;
    ``op`` indexes ``names`` (-1: no op).
    """
    import numpy as np

    order = on[np.lexsort((ts[on], addr[on]))]
    a, s, t = addr[order], size[order], ts[order]
    freed_at = np.full(len(order), np.inf)
    nxt = np.flatnonzero((a[1:] == a[:-1]) & (s[:-1] > 0) & (s[1:] < 0))
    freed_at[nxt] = t[nxt + 1]
    is_alloc = s > 0
    held = is_alloc & (t <= peak_ts) & (freed_at > peak_ts)
    who = op[order] + 1  # 0: no op
    n = len(names) + 1
    calls = np.bincount(who[is_alloc], minlength=n)
    total_bytes = np.bincount(who[is_alloc], weights=s[is_alloc], minlength=n)
    held_bytes = np.bincount(who[held], weights=s[held], minlength=n)
    label = ["(no op)", *names]
    used = np.flatnonzero(calls).tolist()
    used.sort(key=lambda i: (-total_bytes[i], label[i]))
    return [
        {
            "name": label[i],
            "allocations": int(calls[i]),
            "allocated_bytes": int(total_bytes[i]),
            "held_at_peak_bytes": int(held_bytes[i]),
        }
        for i in used[:TOP_OPS]
    ]
