"""GPU timeline analysis of one rank, in Holistic Trace Analysis' terms, plus multi-rank views.

Definitions (HTA 0.5, ``BreakdownAnalysis.get_temporal_breakdown``):

- the GPU activities are the kernels, memcpys and memsets on the device;
- the analysis window: when the rank has two or more ``ProfilerStep#N``, only activities launched
  (their host launch call, matched by correlation id) before the start of the *last* step are
  counted, as HTA does with ``include_last_profiler_step=False``; otherwise all of them;
- span (HTA's ``kernel_time``) = end of the last activity - start of the first;
- idle = span - the union of all activity intervals;
- compute = the union of COMPUTATION kernels; non-compute = span - compute - idle.

Two places where we deliberately differ from HTA 0.5, both documented and tested against a
direct count: HTA counts any event with a ``stream`` arg as GPU work, so a Triton launcher's CPU
op (``args.stream`` on a ``cpu_op``) and ``cuda_sync`` events become "kernels"; we count device
activities only. And HTA rounds fractional-microsecond timestamps inward (ceil start, floor end)
before merging; we keep them as they are.

Idle attribution (per gap in the union of GPU activity, attributed to the activity that ends the
gap): *host wait* is the part of the gap before that activity's launch call started (nothing was
queued: the GPU waited on the CPU); *kernel wait* is the rest (the work was queued but had not
started: launch overhead, stream or event dependencies); *other* is a gap whose next activity has
no launch record.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from ampdiag.trace import kernels as K
from ampdiag.trace.reader import GpuActivity, RankTrace
from ampdiag.trace.step_breakdown import CATEGORIES

TOP_KERNELS = 15
SHORT_KERNEL_US = 10.0

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals, as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(intervals: Iterable[Interval]) -> float:
    """Summed length of (disjoint) intervals."""
    return sum(e - s for s, e in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    out = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def type_overlap(by_type: dict[str, list[Interval]]) -> dict[str, float]:
    """HTA's kernel-type breakdown: time by combination of types running ("A overlapping B")."""
    points: list[tuple[float, int]] = []
    for bit, ktype in enumerate(K.KERNEL_TYPES):
        for s, e in by_type.get(ktype, []):
            points.append((s, 1 << bit))
            points.append((e, -(1 << bit)))
    points.sort()
    out: dict[str, float] = {}
    running = 0
    last = 0.0
    for t, delta in points:
        if running > 0 and t > last:
            label = " overlapping ".join(
                k for bit, k in enumerate(K.KERNEL_TYPES) if running & (1 << bit)
            )
            out[label] = out.get(label, 0.0) + (t - last)
        running += delta
        last = t
    return out


def window(rt: RankTrace) -> tuple[list[GpuActivity], dict[str, Any]]:
    """The GPU activities HTA's temporal breakdown counts, and a description of the window."""
    if len(rt.steps) < 2:
        return list(rt.gpu), {"kind": "whole trace", "steps": len(rt.steps)}
    cutoff = rt.steps[-1][1]
    launches = rt.launches
    kept = [g for g in rt.gpu if g[3] in launches and launches[g[3]][0] < cutoff]
    return kept, {
        "kind": "launched before the last ProfilerStep",
        "steps": len(rt.steps),
        "excluded_step": rt.steps[-1][0],
        "cutoff_us": cutoff,
    }


def breakdown(acts: Sequence[GpuActivity]) -> dict[str, Any]:
    """Span, idle, compute and non-compute time of a set of GPU activities (HTA's definitions)."""
    if not acts:
        return {"span_us": 0.0, "idle_us": 0.0, "compute_us": 0.0, "non_compute_us": 0.0}
    by_type: dict[str, list[Interval]] = {}
    for ts, dur, _s, _c, name, _k in acts:
        by_type.setdefault(K.kernel_type(name), []).append((ts, ts + dur))
    merged = merge(iv for ivs in by_type.values() for iv in ivs)
    span = merged[-1][1] - merged[0][0]
    busy = total(merged)
    compute = total(merge(by_type.get(K.COMPUTATION, [])))
    merged_types = {k: merge(v) for k, v in by_type.items()}
    return {
        "start_us": merged[0][0],
        "end_us": merged[-1][1],
        "span_us": span,
        "busy_us": busy,
        "idle_us": span - busy,
        "compute_us": compute,
        "non_compute_us": busy - compute,
        "_merged": merged,
        "_types": merged_types,
    }


def idle_attribution(acts: Sequence[GpuActivity], rt: RankTrace) -> dict[str, float]:
    """Each gap in GPU activity split into host wait, kernel wait and other (see module doc)."""
    host = kern = other = 0.0
    busy_until = None
    for ts, dur, _s, corr, _n, _k in sorted(acts, key=lambda g: g[0]):
        end = ts + dur
        if busy_until is not None and ts > busy_until:
            gap = ts - busy_until
            launch = rt.launches.get(corr)
            if launch is None:
                other += gap
            else:
                waited = min(max(launch[0] - busy_until, 0.0), gap)
                host += waited
                kern += gap - waited
        busy_until = end if busy_until is None else max(busy_until, end)
    return {"host_wait_us": host, "kernel_wait_us": kern, "other_us": other}


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    values = sorted(values)
    n = len(values)
    return {
        "count": n,
        "mean_us": sum(values) / n,
        "median_us": statistics.median(values),
        "p95_us": values[min(n - 1, int(0.95 * n))],
        "max_us": values[-1],
    }


def top_kernels(acts: Sequence[GpuActivity], n: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The kernels with the most total time: name, type, calls, total/mean/min/max, precision."""
    agg: dict[str, list[float]] = {}
    for _ts, dur, _s, _c, name, _k in acts:
        a = agg.get(name)
        if a is None:
            agg[name] = [1, dur, dur, dur]
        else:
            a[0] += 1
            a[1] += dur
            a[2] = min(a[2], dur)
            a[3] = max(a[3], dur)
    grand = sum(a[1] for a in agg.values()) or 1.0
    rows = []
    for name, (calls, tot, lo, hi) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:n]:
        prec, tc, mm = K.precision(name)
        rows.append(
            {
                "name": name,
                "short_name": K.short_name(name),
                "type": K.kernel_type(name),
                "calls": int(calls),
                "total_us": tot,
                "mean_us": tot / calls,
                "min_us": lo,
                "max_us": hi,
                "share": tot / grand,
                "precision": prec,
                "tensor_core": tc,
                "matmul": mm,
            }
        )
    return rows


def precision_summary(acts: Sequence[GpuActivity]) -> dict[str, Any]:
    """Share of computation-kernel time by precision; tensor cores; FP32 GEMMs/convs."""
    by_prec = dict.fromkeys(K.PRECISIONS, 0.0)
    tc_us = matmul_us = fp32_mm_us = tf32_mm_us = comp_us = 0.0
    fp32_mm: dict[str, list[float]] = {}
    for _ts, dur, _s, _c, name, _k in acts:
        if K.kernel_type(name) != K.COMPUTATION:
            continue
        prec, tc, mm = K.precision(name)
        comp_us += dur
        by_prec[prec] += dur
        if tc:
            tc_us += dur
        if mm:
            matmul_us += dur
            if prec == "fp32" and not tc:
                fp32_mm_us += dur
                a = fp32_mm.setdefault(name, [0, 0.0])
                a[0] += 1
                a[1] += dur
            elif prec == "tf32":
                tf32_mm_us += dur
    denom = comp_us or 1.0
    mm_denom = matmul_us or 1.0
    top = sorted(fp32_mm.items(), key=lambda kv: -kv[1][1])[:10]
    return {
        "compute_kernel_us": comp_us,
        "by_precision_us": by_prec,
        "by_precision_share": {k: v / denom for k, v in by_prec.items()},
        "low_precision_share": (by_prec["fp16"] + by_prec["bf16"] + by_prec["fp8"]) / denom,
        "tensor_core_us": tc_us,
        "tensor_core_share": tc_us / denom,
        "matmul_us": matmul_us,
        "matmul_share": matmul_us / denom,
        "fp32_matmul_us": fp32_mm_us,
        "fp32_matmul_share": fp32_mm_us / mm_denom if matmul_us else 0.0,
        "tf32_matmul_us": tf32_mm_us,
        "fp32_matmul_kernels": [
            {"name": n, "short_name": K.short_name(n), "calls": int(c), "total_us": t}
            for n, (c, t) in top
        ],
    }


_HOST_PRIORITY = ("data", "optimizer", "backward", "forward")


def host_cover(
    spans: Iterable[tuple[float, float, str]], start: float, end: float
) -> dict[str, float]:
    """Time of [start, end] covered by each host category, higher priority winning overlaps.

    Same result as ``step_breakdown._covered_by_category``, by interval unions: each category
    gets its union minus what the categories above it already cover.
    """
    by_cat: dict[str, list[Interval]] = {}
    for s, e, c in spans:
        s, e = max(s, start), min(e, end)
        if e > s:
            by_cat.setdefault(c, []).append((s, e))
    out = dict.fromkeys(CATEGORIES, 0.0)
    above: list[Interval] = []
    for cat in _HOST_PRIORITY:
        mine = merge(by_cat.get(cat, []))
        out[cat] = total(mine) - intersect(mine, above)
        above = merge([*above, *mine])
    out["other"] = max(0.0, (end - start) - total(above))
    return out


def host_breakdown(rt: RankTrace) -> dict[str, Any]:
    """The host step-time breakdown (forward/backward/optimizer/data/other) of the steps."""
    rows = []
    for number, start, end, pid in rt.steps:
        spans = [(s, e, c) for s, e, c, p in rt.host if p == pid and e > start and s < end]
        totals = host_cover(spans, start, end)
        row: dict[str, Any] = {"step": number, "total_us": end - start}
        row.update({f"{c}_us": totals[c] for c in CATEGORIES})
        rows.append(row)
    if not rows:
        return {"steps": [], "mean": {}, "share": {}}
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "step"}
    tot = mean["total_us"] or 1.0
    return {"steps": rows, "mean": mean, "share": {c: mean[f"{c}_us"] / tot for c in CATEGORIES}}


def per_step(rt: RankTrace) -> list[dict[str, Any]]:
    """GPU breakdown of each ProfilerStep: the activities its host work launched."""
    if not rt.steps:
        return []
    starts = [s[1] for s in rt.steps]
    groups: list[list[GpuActivity]] = [[] for _ in rt.steps]
    import bisect

    for g in rt.gpu:
        launch = rt.launches.get(g[3])
        t = launch[0] if launch is not None else g[0]
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t < rt.steps[i][2]:
            groups[i].append(g)
    out = []
    for (number, start, end, _pid), acts in zip(rt.steps, groups, strict=True):
        b = breakdown(acts)
        out.append(
            {
                "step": number,
                "host_us": end - start,
                "kernels": len(acts),
                **{k: v for k, v in b.items() if not k.startswith("_")},
            }
        )
    return out


def analyse_rank(rt: RankTrace) -> dict[str, Any]:
    """Everything the timeline section holds for one rank (JSON-serialisable)."""
    acts, win = window(rt)
    b = breakdown(acts)
    span = b["span_us"] or 0.0
    out: dict[str, Any] = {
        "rank": rt.rank,
        "rank_source": rt.rank_source,
        "file": str(rt.path),
        "device": rt.devices[rt.rank % len(rt.devices)] if rt.devices else None,
        "events": rt.events,
        "gpu_activities": len(rt.gpu),
        "has_gpu": bool(rt.gpu),
        "window": win,
        "activities_in_window": len(acts),
        **{k: v for k, v in b.items() if not k.startswith("_")},
    }
    for key in ("idle", "compute", "non_compute"):
        out[f"{key}_share"] = b[f"{key}_us"] / span if span else 0.0
    host = host_breakdown(rt)
    out["host"] = host
    out["data_share"] = float(host.get("share", {}).get("data", 0.0))
    out["cpu_top_ops"] = [
        {"name": n, "calls": int(c), "inclusive_us": t}
        for n, (c, t) in sorted(rt.cpu_ops.items(), key=lambda kv: -kv[1][1])[:10]
    ]
    out["warnings"] = rt.warnings
    if not acts:
        return out
    types = b["_types"]
    out["kernel_types"] = type_overlap(types)
    out["kernel_type_totals"] = {k: total(types.get(k, [])) for k in K.KERNEL_TYPES}
    out["kernel_counts"] = {
        k: sum(1 for g in acts if K.kernel_type(g[4]) == k) for k in (*K.KERNEL_TYPES, K.OTHER)
    }
    out["top_kernels"] = top_kernels(acts)
    out["idle_breakdown"] = idle_attribution(acts, rt)
    latencies = [g[0] - rt.launches[g[3]][0] for g in acts if g[3] in rt.launches]
    out["launch_latency"] = _stats(latencies)
    kernel_durs = [g[1] for g in acts if g[5] == "kernel"]
    out["kernel_duration"] = _stats(kernel_durs)
    out["short_kernel_share"] = (
        sum(1 for d in kernel_durs if d < SHORT_KERNEL_US) / len(kernel_durs)
        if kernel_durs
        else 0.0
    )
    comm = types.get(K.COMMUNICATION, [])
    comp = types.get(K.COMPUTATION, [])
    comm_us = total(comm)
    overlapped = intersect(comm, comp)
    out["communication"] = {
        "comm_us": comm_us,
        "overlapped_us": overlapped,
        "exposed_us": comm_us - overlapped,
        "overlap_share": overlapped / comm_us if comm_us else 0.0,
        "exposed_share_of_span": (comm_us - overlapped) / span if span else 0.0,
    }
    out["precision"] = precision_summary(acts)
    out["steps"] = per_step(rt)
    n_steps = max(1, len(rt.steps) - 1) if len(rt.steps) >= 2 else max(1, len(rt.steps))
    out["kernels_per_step"] = len(acts) / n_steps
    return out


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Across ranks: the slowest rank, the spread of compute, mean overlap of communication."""
    gpu = [r for r in ranks if r.get("activities_in_window")]
    out: dict[str, Any] = {"ranks": len(ranks), "gpu_ranks": len(gpu)}
    if not gpu:
        return out
    # The rank with the most computation is the one the others wait for at each collective.
    slow = max(gpu, key=lambda r: r["compute_us"])
    fast = min(gpu, key=lambda r: r["compute_us"])
    out["slowest_rank"] = slow["rank"]
    out["slowest_compute_us"] = slow["compute_us"]
    out["fastest_compute_us"] = fast["compute_us"]
    out["compute_spread"] = (
        (slow["compute_us"] - fast["compute_us"]) / slow["compute_us"]
        if slow["compute_us"]
        else 0.0
    )
    comm = [r["communication"] for r in gpu if r.get("communication", {}).get("comm_us")]
    if comm:
        tot = sum(c["comm_us"] for c in comm)
        out["comm_overlap_share"] = sum(c["overlapped_us"] for c in comm) / tot
        out["comm_exposed_us_mean"] = sum(c["exposed_us"] for c in comm) / len(comm)
    for key in ("idle", "compute", "non_compute"):
        out[f"{key}_share_mean"] = sum(r[f"{key}_share"] for r in gpu) / len(gpu)
    return out
