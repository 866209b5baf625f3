"""Communication of one rank, and across ranks: collectives per step, exposed time, stragglers.

Read from either side of the collectives, whichever the trace has: the NCCL kernels on the
GPU (overlapped with computation kernels, the rest exposed), or the collective as the process
group ran it on the host (``gloo:all_reduce``, ``nccl:*``; overlapped with host compute ops).
All ranks leave a collective together, so the *k*-th collective of a step, the same on each
rank, was joined last by the rank that spent the least time in it, and each other rank's
extra time in it is its wait: durations on each rank's own clock, no shared clock needed.
A *micro-batch* is one ``DistributedDataParallel.forward``: the all-reduces per micro-batch
tell ``no_sync()`` accumulation from all-reduces in every one.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import numpy as np

from ampdiag.analysis import kernels as K
from ampdiag.analysis.intervals import Intervals, clip, coverage, empty, intersect, total, union
from ampdiag.trace.columns import HOST_CATEGORIES

if TYPE_CHECKING:
    from ampdiag.trace.records import RankTrace

_CAT = {name: i for i, name in enumerate(HOST_CATEGORIES)}
_COMPUTE = ("forward", "backward", "optimizer")
BREAKDOWN = ("data", "optimizer", "backward", "forward", "communication", "other")
"""Where a step's host time goes, each moment given to the first of these that covers it;
"communication" is time inside a collective not covered by any op (a rank waiting)."""


def _host(cols: Any, name: str) -> tuple[Any, Any]:
    sel = cols.host_cat == _CAT[name]
    return cols.host_start[sel], cols.host_end[sel]


def _gpu_comm(rt: RankTrace) -> tuple[Any, Any, Any, Any, Any]:
    """(start, end, when launched or started, is-all-reduce, compute union) of NCCL kernels."""
    cols = rt.columns()
    types = np.array([K.kernel_type(n) for n in cols.names], dtype=object)
    if not len(cols.gpu_ts):
        return np.empty(0), np.empty(0), np.empty(0), np.empty(0, dtype=bool), empty()
    kt = types[cols.gpu_name]
    comm = kt == K.COMMUNICATION
    comp = kt == K.COMPUTATION
    ts, end = cols.gpu_ts, cols.gpu_ts + cols.gpu_dur
    li = cols.launch_index(cols.gpu_corr)
    at = np.where(li >= 0, cols.launch_ts[np.maximum(li, 0)] if len(cols.launch_ts) else 0, ts)
    allreduce = np.array(
        ["allreduce" in cols.names[n].lower().replace("_", "") for n in cols.gpu_name[comm]],
        dtype=bool,
    )
    return ts[comm], end[comm], at[comm], allreduce, union(ts[comp], end[comp])


def rank_communication(rt: RankTrace) -> dict[str, Any]:
    """Collectives of each ``ProfilerStep`` of one rank (see the module doc), JSON-ready.

    Returns:
        ``{"source": "gpu" | "host" | None, "steps": [...], "per_step": {...}}``: per step the
        collectives' ``count``, ``time_us`` (their union), ``overlapped_us`` and ``exposed_us``,
        each collective's ``durations_us`` in order, ``micro_batches`` and the all-reduces in
        each micro-batch, and the host ``breakdown_us`` (see `BREAKDOWN`).
    """
    cols = rt.columns()
    g_start, g_end, g_at, g_ar, g_comp = _gpu_comm(rt)
    h_ar = _host(cols, "all_reduce")
    h_other = _host(cols, "collective")
    h_start = np.concatenate([h_ar[0], h_other[0]])
    h_end = np.concatenate([h_ar[1], h_other[1]])
    source = "gpu" if len(g_start) else "host" if len(h_start) else None
    if source == "gpu":
        starts, ends, at, is_ar, compute = g_start, g_end, g_at, g_ar, g_comp
    else:
        order = np.argsort(h_start, kind="stable")
        starts, ends = h_start[order], h_end[order]
        at = starts
        is_ar = (np.arange(len(h_start)) < len(h_ar[0]))[order]
        comp_s = np.concatenate([_host(cols, c)[0] for c in _COMPUTE])
        comp_e = np.concatenate([_host(cols, c)[1] for c in _COMPUTE])
        compute = union(comp_s, comp_e)
    mb_start = np.sort(_host(cols, "micro_batch")[0])
    rows = []
    for number, s0, s1, _pid in rt.steps:
        inside = (at >= s0) & (at < s1)
        st, en, ar = starts[inside], ends[inside], is_ar[inside]
        comm = union(st, en)
        comm_us = total(comm)
        overlapped = intersect(comm, compute) if comm_us else 0.0
        mbs = mb_start[(mb_start >= s0) & (mb_start < s1)]
        per_mb: list[int] = []
        if len(mbs):
            which = np.searchsorted(mbs, at[inside][ar], side="right") - 1
            per_mb = np.bincount(which[which >= 0], minlength=len(mbs)).tolist()
        rows.append(
            {
                "step": number,
                "step_us": s1 - s0,
                "count": len(st),
                "allreduces": int(np.count_nonzero(ar)),
                "time_us": comm_us,
                "overlapped_us": overlapped,
                "exposed_us": comm_us - overlapped,
                "durations_us": (en - st).tolist(),
                "micro_batches": len(mbs),
                "allreduces_per_micro_batch": per_mb,
                "breakdown_us": _breakdown(cols, s0, s1, (h_start, h_end)),
            }
        )
    n = len(rows) or 1
    per_step = {
        key: sum(float(r[key]) for r in rows) / n
        for key in ("count", "allreduces", "time_us", "overlapped_us", "exposed_us")
    }
    return {"source": source, "steps": rows, "per_step": per_step}


def _breakdown(cols: Any, start: float, end: float, comm: Intervals) -> dict[str, float]:
    """Host time of [start, end] by `BREAKDOWN`, the first category covering a moment winning."""
    groups = [union(*clip(_host(cols, c), start, end)) for c in BREAKDOWN[:4]]
    groups.append(union(*clip(comm, start, end)))
    cov = coverage(groups)
    out = dict.fromkeys(BREAKDOWN, 0.0)
    covered = 0.0
    for mask in range(1, len(cov)):
        out[BREAKDOWN[(mask & -mask).bit_length() - 1]] += float(cov[mask])
        covered += float(cov[mask])
    out["other"] = max(0.0, (end - start) - covered)
    return out


def across_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Matches the ranks' collectives step by step and finds the rank the others wait for.

    Args:
        ranks: Per rank ``{"rank": r, "collectives": rank_communication(...)}`` (more keys
            allowed), e.g. the timeline section's ranks.

    Returns:
        ``matched`` (collectives compared), ``last_counts`` (rank -> times it arrived last),
        ``wait_us_per_step`` (rank -> mean time per step it waited for the last arrival),
        and, where one rank is last in most collectives, ``straggler`` with its ``rank``,
        per-step ``lateness_us``, ``last_share``, ``attributed_us_per_step`` (the others'
        waiting summed) and ``extra_us_per_step`` (its host time by category, less the others'
        mean; "other" counts host time outside ops less the time each rank waited for others).
    """
    have = [r for r in ranks if (r.get("collectives") or {}).get("steps")]
    out: dict[str, Any] = {"ranks": [r["rank"] for r in have], "matched": 0}
    if len(have) < 2:
        return out
    by_step = [{s["step"]: s for s in r["collectives"]["steps"]} for r in have]
    common = sorted(set.intersection(*(set(b) for b in by_step)))
    last = dict.fromkeys(range(len(have)), 0)
    wait = [[0.0] * len(common) for _ in have]
    matched = 0
    for j, step in enumerate(common):
        durs = [b[step]["durations_us"] for b in by_step]
        for k in range(min(len(d) for d in durs)):
            col = [d[k] for d in durs]
            low = min(col)
            last[col.index(low)] += 1
            for i, d in enumerate(col):
                wait[i][j] += d - low
            matched += 1
    ids = [r["rank"] for r in have]
    out["matched"] = matched
    out["steps"] = common
    out["last_counts"] = {str(ids[i]): n for i, n in last.items()}
    out["wait_us_per_step"] = {
        str(ids[i]): sum(w) / len(common) if common else 0.0 for i, w in enumerate(wait)
    }
    if not matched:
        return out
    s = max(last, key=lambda i: last[i])
    others = [i for i in range(len(have)) if i != s]
    lateness = [max(wait[i][j] for i in others) for j in range(len(common))]
    step_us = [by_step[s][step]["step_us"] for step in common]

    def host(i: int, cat: str) -> float:
        """Rank i's mean host time per step in a category.

        "other" is its time outside ops and not waiting for another rank (in a host
        collective or, on a GPU run, anywhere: a GPU run's host waits outside any op).
        """
        rows = [by_step[i][st]["breakdown_us"] for st in common]
        if cat != "other":
            return float(sum(b[cat] for b in rows)) / len(rows)
        free = [b["other"] + b["communication"] - w for b, w in zip(rows, wait[i], strict=True)]
        return float(sum(max(0.0, f) for f in free)) / len(rows)

    extra = {
        cat: host(s, cat) - sum(host(i, cat) for i in others) / len(others)
        for cat in BREAKDOWN
        if cat != "communication"
    }
    out["straggler"] = {
        "rank": ids[s],
        "lateness_us_min": min(lateness),
        "last_share": last[s] / matched,
        "lateness_us": lateness,
        "lateness_us_median": statistics.median(lateness),
        "step_us_median": statistics.median(step_us),
        "attributed_us_per_step": sum(sum(wait[i]) for i in others) / len(common),
        "extra_us_per_step": extra,
        "gpu_compute_extra_us_per_step": _gpu_compute_extra(have, s, others),
    }
    return out


def _gpu_compute_extra(have: list[dict[str, Any]], s: int, others: list[int]) -> float | None:
    """The straggler's GPU computation time per step less the others' mean (GPU traces)."""

    def per_step(r: dict[str, Any]) -> float | None:
        steps = [x for x in r.get("steps") or [] if isinstance(x, dict)]
        if not steps:
            return None
        return sum(float(x.get("compute_us", 0.0)) for x in steps) / len(steps)

    mine = per_step(have[s])
    theirs = [per_step(have[i]) for i in others]
    if mine is None or any(t is None for t in theirs):
        return None
    return mine - sum(t for t in theirs if t is not None) / len(theirs)
