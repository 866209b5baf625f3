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
from typing import TYPE_CHECKING, Any

import numpy as np

from ampdiag.analysis import kernels as K
from ampdiag.analysis.intervals import (
    Intervals,
    clip,
    coverage,
    covered_by_group,
    empty,
    intersect,
    sorted_disjoint,
    step_pairs,
    total,
    union,
)
from ampdiag.analysis.memory_timeline import trace_memory
from ampdiag.trace.columns import GPU_KINDS, HOST_CATEGORIES, Columns
from ampdiag.trace.records import RankTrace
from ampdiag.trace.step_breakdown import CATEGORIES, summarize

if TYPE_CHECKING:
    from numpy.typing import NDArray

    F64 = NDArray[np.float64]
    I64 = NDArray[np.int64]

TOP_KERNELS = 15
TOP_MODULES = 20
SHORT_KERNEL_US = 10.0

TYPE_ORDER = (*K.KERNEL_TYPES, K.OTHER)
_KERNEL = GPU_KINDS.index("kernel")


def _type_codes(cols: Columns) -> I64:
    """HTA kernel type (index into TYPE_ORDER) of every name."""
    index = {t: i for i, t in enumerate(TYPE_ORDER)}
    return np.array([index[K.kernel_type(n)] for n in cols.names], dtype=np.int64).reshape(-1)


class _Acts:
    """The GPU activities being analyzed (a selection of a rank's columns)."""

    def __init__(self, cols: Columns, name_type: I64, mask: Any = None) -> None:
        self.cols = cols if mask is None else cols.take_gpu(mask)
        c = self.cols
        self.name_type = name_type
        self.ts = c.gpu_ts
        self.end = c.gpu_ts + c.gpu_dur
        self.type = name_type[c.gpu_name] if len(c.gpu_name) else np.empty(0, dtype=np.int64)
        self.launch = c.launch_index(c.gpu_corr)

    def __len__(self) -> int:
        return len(self.ts)


def type_overlap(types: dict[str, Intervals]) -> dict[str, float]:
    """HTA's kernel-type breakdown: time by combination of types running ("A overlapping B")."""
    cov = coverage([types.get(k, empty()) for k in K.KERNEL_TYPES])
    out: dict[str, float] = {}
    for mask in range(1, len(cov)):
        if cov[mask] > 0:
            label = " overlapping ".join(
                k for bit, k in enumerate(K.KERNEL_TYPES) if mask & (1 << bit)
            )
            out[label] = float(cov[mask])
    return out


def window(rt: RankTrace) -> tuple[Any, dict[str, Any]]:
    """Which GPU activities HTA's temporal breakdown counts (a bool mask or None: all)."""
    if len(rt.steps) < 2:
        return None, {"kind": "whole trace", "steps": len(rt.steps)}
    cols = rt.columns()
    cutoff = rt.steps[-1][1]
    li = cols.launch_index(cols.gpu_corr)
    has = li >= 0
    kept = has.copy()
    kept[has] = cols.launch_ts[li[has]] < cutoff
    return kept, {
        "kind": "launched before the last ProfilerStep",
        "steps": len(rt.steps),
        "excluded_step": rt.steps[-1][0],
        "cutoff_us": cutoff,
    }


def breakdown(acts: _Acts) -> dict[str, Any]:
    """Span, idle, compute and non-compute time of a set of GPU activities (HTA's definitions)."""
    if not len(acts):
        return {"span_us": 0.0, "idle_us": 0.0, "compute_us": 0.0, "non_compute_us": 0.0}
    merged = union(acts.ts, acts.end)
    start, end = float(merged[0][0]), float(merged[1][-1])
    busy = total(merged)
    types: dict[str, Intervals] = {}
    for code in np.flatnonzero(np.bincount(acts.type, minlength=len(TYPE_ORDER))).tolist():
        sel = acts.type == code
        types[TYPE_ORDER[code]] = union(acts.ts[sel], acts.end[sel])
    comp = types.get(K.COMPUTATION)
    compute = total(comp) if comp is not None else 0.0
    return {
        "start_us": start,
        "end_us": end,
        "span_us": end - start,
        "busy_us": busy,
        "idle_us": end - start - busy,
        "compute_us": compute,
        "non_compute_us": busy - compute,
        "_merged": merged,
        "_types": types,
    }


def idle_attribution(acts: _Acts) -> dict[str, float]:
    """Each gap in GPU activity split into host wait, kernel wait and other (see module doc)."""
    if len(acts) < 2:
        return {"host_wait_us": 0.0, "kernel_wait_us": 0.0, "other_us": 0.0}
    busy_until = np.maximum.accumulate(acts.end)[:-1]
    ts = acts.ts[1:]
    gap_at = np.flatnonzero(ts > busy_until)
    gap = ts[gap_at] - busy_until[gap_at]
    li = acts.launch[1:][gap_at]
    has = li >= 0
    cols = acts.cols
    waited = np.clip(cols.launch_ts[li[has]] - busy_until[gap_at][has], 0.0, gap[has])
    return {
        "host_wait_us": float(np.sum(waited)),
        "kernel_wait_us": float(np.sum(gap[has] - waited)),
        "other_us": float(np.sum(gap[~has])),
    }


def _stats(values: F64) -> dict[str, float]:
    if not len(values):
        return {"count": 0}
    values = np.sort(values)
    n = len(values)
    return {
        "count": n,
        "mean_us": float(np.sum(values)) / n,
        # not np.median, which imports numpy.ma (30 ms)
        "median_us": statistics.median(values.tolist()),
        "p95_us": float(values[min(n - 1, int(0.95 * n))]),
        "max_us": float(values[-1]),
    }


def _per_name(acts: _Acts) -> tuple[I64, F64, F64, F64, F64]:
    """(names in first-appearance order, calls, total, min, max of duration) of each name."""
    names = acts.cols.gpu_name
    dur = acts.cols.gpu_dur
    n = len(acts.cols.names)
    calls = np.bincount(names, minlength=n).astype(np.float64)
    tot: F64 = np.asarray(np.bincount(names, weights=dur, minlength=n), dtype=np.float64)
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    first = np.full(n, len(names), dtype=np.int64)
    np.minimum.at(lo, names, dur)
    np.maximum.at(hi, names, dur)
    np.minimum.at(first, names, np.arange(len(names)))
    used = np.flatnonzero(calls)
    ids: I64 = used[np.argsort(first[used], kind="stable")].astype(np.int64)
    return ids, calls[ids], tot[ids], lo[ids], hi[ids]


def top_kernels(acts: _Acts, n: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The kernels with the most total time: name, type, calls, total/mean/min/max, precision."""
    ids, calls, tot, lo, hi = _per_name(acts)
    grand = float(np.sum(tot)) or 1.0
    rows = []
    for j in np.argsort(-tot, kind="stable")[:n].tolist():
        name = acts.cols.names[int(ids[j])]
        prec, tc, mm = K.precision(name)
        rows.append(
            {
                "name": name,
                "short_name": K.short_name(name),
                "type": K.kernel_type(name),
                "calls": int(calls[j]),
                "total_us": float(tot[j]),
                "mean_us": float(tot[j]) / float(calls[j]),
                "min_us": float(lo[j]),
                "max_us": float(hi[j]),
                "share": float(tot[j]) / grand,
                "precision": prec,
                "tensor_core": tc,
                "matmul": mm,
            }
        )
    return rows


def precision_summary(acts: _Acts) -> dict[str, Any]:
    """Share of computation-kernel time by precision; tensor cores; FP32 GEMMs/convs."""
    by_prec = dict.fromkeys(K.PRECISIONS, 0.0)
    tc_us = matmul_us = fp32_mm_us = tf32_mm_us = comp_us = 0.0
    fp32_mm: list[tuple[str, int, float]] = []
    ids, calls, tot, _lo, _hi = _per_name(acts)
    for i, c, dur in zip(ids.tolist(), calls.tolist(), tot.tolist(), strict=True):
        name = acts.cols.names[i]
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
                fp32_mm.append((name, int(c), dur))
            elif prec == "tf32":
                tf32_mm_us += dur
    denom = comp_us or 1.0
    mm_denom = matmul_us or 1.0
    top = sorted(fp32_mm, key=lambda r: -r[2])[:10]
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
            {"name": n, "short_name": K.short_name(n), "calls": c, "total_us": t} for n, c, t in top
        ],
    }


_HOST_PRIORITY = ("data", "optimizer", "backward", "forward")
_LIVE = [HOST_CATEGORIES.index(c) for c in (*_HOST_PRIORITY, "closure")]
"""The host categories whose live spans decide a segment's category."""


def host_breakdown(rt: RankTrace) -> dict[str, Any]:
    """The host step-time breakdown (forward/backward/optimizer/data/other) of the steps.

    Each elementary segment of a step goes to the highest-priority category of the host spans
    of its process covering it (data > optimizer > backward > forward; inside an optimizer's
    closure, optimizer does not count); what none covers is "other". Computed for all steps at
    once: time in O((host spans + steps) log).
    """
    if not rt.steps:
        return summarize([])
    cols = rt.columns()
    n = len(rt.steps)
    total_by = np.zeros((n, len(CATEGORIES)))
    pid_of = np.array(
        [cols.pids.index(str(p)) if str(p) in cols.pids else -1 for _, _, _, p in rt.steps]
    )
    starts_all = np.array([st[1] for st in rt.steps], dtype=np.float64)
    ends_all = np.array([st[2] for st in rt.steps], dtype=np.float64)
    for pid in sorted(set(pid_of.tolist())):  # not np.unique, which imports numpy.ma (10 ms)
        which = np.flatnonzero(pid_of == pid)
        on = np.flatnonzero(cols.host_pid == pid)
        hs, he, hc = cols.host_start[on], cols.host_end[on], cols.host_cat[on]
        st, en = starts_all[which], ends_all[which]
        if sorted_disjoint(st, en):
            span, step = step_pairs(st, en, hs, he)
        else:  # overlapping steps (not written by torch): every span against every step
            span = np.tile(np.arange(len(hs)), len(which))
            step = np.repeat(np.arange(len(which)), len(hs))
        s = np.maximum(hs[span], st[step])
        e = np.minimum(he[span], en[step])
        ok = e > s
        s, e, cat, step = s[ok], e[ok], hc[span[ok]], step[ok]
        # one sweep: per category +1/-1, sorted by step then time; a segment goes to the
        # highest-priority category live in it
        t = np.concatenate([s, e])
        k = np.concatenate([cat, cat])
        sign = np.concatenate([np.ones(len(s)), -np.ones(len(e))])
        g = np.concatenate([step, step])
        order = np.lexsort((t, g))
        t, k, sign, g = t[order], k[order], sign[order], g[order]
        # one row per category (only those the priority reads: communication is not a step
        # category), each a contiguous run
        live = np.zeros((len(HOST_CATEGORIES), len(t)), dtype=bool)
        for c in _LIVE:
            live[c] = np.cumsum(np.where(k == c, sign, 0.0)) > 0.5
        # inside an optimizer's step(closure): forward/backward (or other), never optimizer
        live[HOST_CATEGORIES.index("optimizer")] &= ~live[HOST_CATEGORIES.index("closure")]
        winner = np.full(len(t), -1, dtype=np.int64)
        for name in reversed(_HOST_PRIORITY):  # the highest priority written last, so it wins
            winner[live[HOST_CATEGORIES.index(name)]] = CATEGORIES.index(name)
        seg = np.diff(t) if len(t) else np.empty(0)
        use = (winner[:-1] >= 0) & (g[1:] == g[:-1])
        flat = np.bincount(
            g[:-1][use] * len(CATEGORIES) + winner[:-1][use],
            weights=seg[use],
            minlength=len(which) * len(CATEGORIES),
        )
        total_by[which] = flat.reshape(len(which), len(CATEGORIES))
    other = CATEGORIES.index("other")
    total_by[:, other] = np.maximum(0.0, (ends_all - starts_all) - total_by.sum(axis=1))
    keys = [f"{c}_us" for c in CATEGORIES]
    rows = []
    for (number, start, end, _pid), values in zip(rt.steps, total_by.tolist(), strict=True):
        row: dict[str, Any] = {"step": number, "total_us": end - start}
        row.update(zip(keys, values, strict=True))
        rows.append(row)
    return summarize(rows)


ATTRIBUTION = (
    "GPU work belongs to the step whose host span holds its launch call (matched by "
    "correlation id); work whose launch call is not in the trace (launched before the "
    "profiler started) belongs to no step: it is left out of the per-step rows and of the "
    "totals over steps, as HTA and the TensorBoard profiler plugin leave it out, and counted "
    "only where the whole trace is counted (a trace with fewer than two steps)."
)
"""The one rule for GPU work without a launch record (per-step rows and totals alike)."""


def per_step(rt: RankTrace, name_type: I64) -> list[dict[str, Any]]:
    """GPU breakdown of each ProfilerStep: the activities its host work launched (ATTRIBUTION).

    All steps at once (one grouped sweep for the busy time, one for the computation kernels),
    so the time grows with activities + steps, not their product.
    """
    if not rt.steps:
        return []
    cols = rt.columns()
    n = len(rt.steps)
    starts = np.array([s[1] for s in rt.steps], dtype=np.float64)
    ends = np.array([s[2] for s in rt.steps], dtype=np.float64)
    li = cols.launch_index(cols.gpu_corr)
    has = li >= 0
    # ATTRIBUTION: work without a launch record belongs to no step
    t = np.where(has, cols.launch_ts[np.maximum(li, 0)] if len(li) else 0.0, np.inf)
    i = np.searchsorted(starts, t, side="right") - 1
    ok = has & (i >= 0)
    ok[ok] = t[ok] < ends[i[ok]]
    sel = np.flatnonzero(ok)
    group = i[sel]
    ts = cols.gpu_ts[sel]
    end = ts + cols.gpu_dur[sel]
    kernels = np.bincount(group, minlength=n)
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    np.minimum.at(first, group, ts)
    np.maximum.at(last, group, end)
    busy = covered_by_group(group, ts, end, n)
    is_comp = name_type[cols.gpu_name[sel]] == TYPE_ORDER.index(K.COMPUTATION)
    compute = covered_by_group(group[is_comp], ts[is_comp], end[is_comp], n)
    out = []
    columns = zip(
        rt.steps,
        kernels.tolist(),
        first.tolist(),
        last.tolist(),
        busy.tolist(),
        compute.tolist(),
        strict=True,
    )
    for (number, start, stop, _pid), count, lo, hi, b, c in columns:
        row: dict[str, Any] = {"step": number, "host_us": stop - start, "kernels": count}
        if count:
            row.update(
                start_us=lo,
                end_us=hi,
                span_us=hi - lo,
                busy_us=b,
                idle_us=hi - lo - b,
                compute_us=c,
                non_compute_us=b - c,
            )
        else:
            row.update(span_us=0.0, idle_us=0.0, compute_us=0.0, non_compute_us=0.0)
        out.append(row)
    return out


DEFINITIONS = {
    "step_us": "ampdiag's step time: the host span of ProfilerStep#N (the time the training "
    "loop spent in the step).",
    "plugin_step_us": "the TensorBoard profiler plugin's step time: the step stretched to the end "
    "of the GPU work its launch calls started, and begun no earlier than the previous step's "
    "stretched end (on a trace with GPU work; trailing steps that launched no GPU work, or "
    "under 80% of the previous step's, dropped).",
    "data_us": "ampdiag's data-loading time: the part of the step the loop spent inside "
    "enumerate(DataLoader)/enumerate(DataPipe) (the time it waited for a batch).",
    "plugin_data_us": "the plugin's data-loading time: that loading, within the plugin's step, "
    "not hidden behind GPU work or a launch call (what a faster loader could win back).",
}
"""The two definitions of step time and of data-loading time, named (headline: ampdiag's)."""


def plugin_steps(rt: RankTrace) -> list[dict[str, Any]]:
    """Step time and data-loading time per step as the TensorBoard profiler plugin defined them.

    The plugin (torch-tb-profiler, ``StepParser._find_device_steps`` / ``_update_steps_duration``
    and ``OverallParser``): a step's GPU work is that of the launch calls lying wholly inside its
    host span; the step ends at the later of its host end and that work's end, and starts no
    earlier than the previous step's (stretched) end; before the first step, GPU work no step
    launched that ends before the first step's GPU work moves its start. Data loading is then
    the loader's spans inside the stretched step, less what GPU activities and launch calls
    cover. See DEFINITIONS; ampdiag's own are ``host.steps``.
    """
    if not rt.steps:
        return []
    cols = rt.columns()
    n = len(rt.steps)
    st = np.array([s[1] for s in rt.steps])
    en = np.array([s[2] for s in rt.steps])
    lt, le = cols.launch_ts, cols.launch_ts + cols.launch_dur
    li = cols.launch_index(cols.gpu_corr)
    has = li >= 0
    gs, ge = cols.gpu_ts[has], cols.gpu_ts[has] + cols.gpu_dur[has]
    lts, lte = lt[li[has]], le[li[has]]
    i = np.searchsorted(st, lts, side="right") - 1
    inside = (i >= 0) & (lte <= en[np.maximum(i, 0)])
    i, gs_in, ge_in = i[inside], gs[inside], ge[inside]
    matched = np.bincount(i, minlength=n)
    dev_lo = np.full(n, np.inf)
    dev_hi = np.full(n, -np.inf)
    np.minimum.at(dev_lo, i, gs_in)
    np.maximum.at(dev_hi, i, ge_in)
    rows_steps = list(range(n))
    if matched.any():
        prev = float(st[0])
        if matched[0]:
            unmatched_end = np.concatenate([ge[~inside], cols.gpu_ts[~has] + cols.gpu_dur[~has]])
            before = unmatched_end[unmatched_end < dev_lo[0]]
            if len(before):
                prev = max(prev, float(before.max()))
        starts, ends = [], []
        for k in range(n):
            a = max(prev, float(st[k]))
            b = float(en[k])
            b = max(b, a) if not matched[k] else max(b, float(dev_hi[k]))
            b = max(b, a)
            starts.append(a)
            ends.append(b)
            prev = b
        if n > 1:
            last = int(np.flatnonzero(matched)[-1])
            keep = last + 1
            if last > 0 and matched[last - 1] * 0.8 > matched[last]:
                keep = last
            rows_steps = rows_steps[:keep]
    else:
        starts, ends = st.tolist(), en.tolist()
    data = cols.host_cat == HOST_CATEGORIES.index("data")
    loader = union(cols.host_start[data], cols.host_end[data])
    gpu_or_launch = union(
        np.concatenate([cols.gpu_ts, lt]), np.concatenate([cols.gpu_ts + cols.gpu_dur, le])
    )
    rows = []
    for k in rows_steps:
        a, b = starts[k], ends[k]
        exposed = coverage([clip(loader, a, b), clip(gpu_or_launch, a, b)])[1]
        rows.append(
            {"step": rt.steps[k][0], "plugin_step_us": b - a, "plugin_data_us": float(exposed)}
        )
    return rows


def analyze_rank(rt: RankTrace) -> dict[str, Any]:
    """Everything the timeline section holds for one rank (JSON-serializable)."""
    cols = rt.columns()
    name_type = _type_codes(cols)
    mask, win = window(rt)
    acts = _Acts(cols, name_type, mask)
    b = breakdown(acts)
    span = b["span_us"] or 0.0
    out: dict[str, Any] = {
        "rank": rt.rank,
        "rank_source": rt.rank_source,
        "file": str(rt.path),
        "device": rt.devices[rt.rank % len(rt.devices)] if rt.devices else None,
        "events": rt.events,
        "gpu_activities": len(cols.gpu_ts),
        "has_gpu": bool(len(cols.gpu_ts)),
        "window": win,
        "attribution": ATTRIBUTION,
        "activities_in_window": len(acts),
        **{k: v for k, v in b.items() if not k.startswith("_")},
    }
    for key in ("idle", "compute", "non_compute"):
        out[f"{key}_share"] = b[f"{key}_us"] / span if span else 0.0
    host = host_breakdown(rt)
    out["host"] = host
    out["data_share"] = float(host.get("share", {}).get("data", 0.0))
    out["plugin_steps"] = plugin_steps(rt)
    out["definitions"] = DEFINITIONS
    memory = trace_memory(rt)
    if memory is not None:
        out["memory"] = memory
    if rt.modules:
        out["modules"] = [
            {"module": m, "calls": int(c), "inclusive_us": t}
            for m, (c, t) in sorted(rt.modules.items(), key=lambda kv: -kv[1][1])[:TOP_MODULES]
        ]
    out["cpu_top_ops"] = [
        {"name": n, "calls": int(c), "inclusive_us": t}
        for n, (c, t) in sorted(rt.cpu_ops.items(), key=lambda kv: -kv[1][1])[:10]
    ]
    out["warnings"] = rt.warnings
    if not len(acts):
        return out
    types = b["_types"]
    out["kernel_types"] = type_overlap(types)
    out["kernel_type_totals"] = {k: total(types[k]) if k in types else 0.0 for k in K.KERNEL_TYPES}
    counts = np.bincount(acts.type, minlength=len(TYPE_ORDER))
    out["kernel_counts"] = {k: int(counts[i]) for i, k in enumerate(TYPE_ORDER)}
    # the table covers every recorded step (all the trace's activities), whatever the window
    every = _Acts(cols, name_type)
    out["top_kernels"] = top_kernels(every)
    out["top_kernels_cover"] = {
        "kind": "whole trace",
        "steps": [s[0] for s in rt.steps],
        "activities": len(every),
        "unlaunched": int(np.count_nonzero(every.launch < 0)),
    }
    out["idle_breakdown"] = idle_attribution(acts)
    has = acts.launch >= 0
    latencies = acts.ts[has] - acts.cols.launch_ts[acts.launch[has]]
    out["launch_latency"] = _stats(latencies)
    kernel_durs = acts.cols.gpu_dur[acts.cols.gpu_kind == _KERNEL]
    out["kernel_duration"] = _stats(kernel_durs)
    out["short_kernel_share"] = (
        float(np.count_nonzero(kernel_durs < SHORT_KERNEL_US)) / len(kernel_durs)
        if len(kernel_durs)
        else 0.0
    )
    comm = types.get(K.COMMUNICATION, empty())
    comp = types.get(K.COMPUTATION, empty())
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
    out["steps"] = per_step(rt, name_type)
    n_steps = max(1, len(rt.steps) - 1) if len(rt.steps) >= 2 else max(1, len(rt.steps))
    out["kernels_per_step"] = len(acts) / n_steps
    return out


def summarize_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
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


def header_facts(rank: dict[str, Any]) -> dict[str, Any]:
    """What a trace's header states: its profiled steps and the precisions its kernels ran in.

    A trace has no per-step records of a live run (``session.steps``) and no autocast setting
    of its own, so its header reads these instead: the ``ProfilerStep`` count with the median,
    shortest and longest step (host time), and each precision's share of the computation-kernel
    time, largest first ("unknown" and zero shares left out).
    """
    rows = rank.get("host", {}).get("steps") or []
    times = sorted(float(r["total_us"]) for r in rows)
    steps: dict[str, Any] = {"count": len(times)}
    if times:
        steps.update(median_us=statistics.median(times), min_us=times[0], max_us=times[-1])
    shares = rank.get("precision", {}).get("by_precision_share", {})
    kernels = {
        k: float(v)
        for k, v in sorted(shares.items(), key=lambda kv: -float(kv[1]))
        if k != "unknown" and float(v) > 0
    }
    return {"profiled_steps": steps, "kernel_precisions": kernels}
