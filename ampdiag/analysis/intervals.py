"""Interval algebra on numpy arrays: the time covered by sets of intervals, in one sort each.

The timeline (GPU busy, idle, kernel-type overlap), the host step breakdown and communication
(exposed collective time) all ask the same questions of intervals: their union, the time covered
by each combination of several unions, per group, or per step. Each answer is a sweep over the
sorted endpoints (+1 at a start, -1 at an end), vectorized: linear in the intervals after the
sort, with no Python loop over events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    F64 = NDArray[np.float64]
    I64 = NDArray[np.int64]

Intervals = tuple["F64", "F64"]
"""Sorted, disjoint intervals as (starts, ends)."""


def union(starts: F64, ends: F64) -> Intervals:
    """The union of intervals as sorted, disjoint intervals (touching ones are joined)."""
    if not len(starts):
        return np.empty(0), np.empty(0)
    order = np.lexsort((ends, starts))
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def total(iv: Intervals) -> float:
    """Summed length of disjoint intervals."""
    return float(np.sum(iv[1] - iv[0]))


def coverage(groups: list[Intervals]) -> F64:
    """Time covered by each combination of groups: ``out[mask]``, bit k set for group k.

    Each group must be disjoint intervals (a union). Segments covered by no group are mask 0.
    """
    times = [iv[0] for iv in groups] + [iv[1] for iv in groups]
    deltas = [np.full(len(iv[0]), 1 << k, dtype=np.int64) for k, iv in enumerate(groups)]
    deltas += [np.full(len(iv[1]), -(1 << k), dtype=np.int64) for k, iv in enumerate(groups)]
    t = np.concatenate(times) if times else np.empty(0)
    d = np.concatenate(deltas) if deltas else np.empty(0, dtype=np.int64)
    out = np.zeros(1 << len(groups))
    if len(t) < 2:
        return out
    order = np.lexsort((-d, t))  # at equal times starts first: no group goes below zero
    t, d = t[order], d[order]
    running = np.cumsum(d)[:-1]
    out += np.bincount(running, weights=np.diff(t), minlength=len(out))
    return out


def intersect(a: Intervals, b: Intervals) -> float:
    """Length of the intersection of two unions."""
    return float(coverage([a, b])[3])


def covered_by_group(group: I64, starts: F64, ends: F64, groups: int) -> F64:
    """Length of the union of the intervals of each group (``out[g]``), in one sort.

    A sweep over all groups at once: +1 at each start, -1 at each end, sorted by group then
    time; a segment counts where the running count is positive. Every group's counts sum to
    zero, so the sweep never carries from one group into the next.
    """
    out = np.zeros(groups)
    if not len(starts):
        return out
    t = np.concatenate([starts, ends])
    g = np.concatenate([group, group])
    d = np.concatenate([np.ones(len(starts), np.int64), np.full(len(ends), -1, np.int64)])
    order = np.lexsort((-d, t, g))
    t, g, d = t[order], g[order], d[order]
    live = (np.cumsum(d)[:-1] > 0) & (g[1:] == g[:-1])
    out += np.bincount(g[:-1], weights=np.where(live, np.diff(t), 0.0), minlength=groups)
    return out


def step_pairs(starts: F64, ends: F64, s: F64, e: F64) -> tuple[I64, I64]:
    """(interval index, step index) of each interval and step that overlap (step-sorted steps).

    Steps must be sorted and not overlap one another (ends ascending too); each interval is
    paired with the run of steps it overlaps, so the pairs number about intervals + steps.
    """
    first = np.searchsorted(ends, s, side="right")  # the first step ending after the start
    last = np.searchsorted(starts, e, side="left")  # past the last step starting before the end
    count = np.maximum(last - first, 0)
    idx = np.repeat(np.arange(len(s)), count)
    offset = np.arange(len(idx)) - np.repeat(np.cumsum(count) - count, count)
    return idx.astype(np.int64), (np.repeat(first, count) + offset).astype(np.int64)


def sorted_disjoint(starts: F64, ends: F64) -> bool:
    """Whether the intervals are sorted and none overlaps the next."""
    return bool(np.all(starts[1:] >= ends[:-1])) if len(starts) > 1 else True


def empty() -> Intervals:
    """No intervals."""
    return np.empty(0), np.empty(0)


def clip(iv: Intervals, start: float, end: float) -> Intervals:
    """The intervals cut to [start, end] (those left empty dropped)."""
    s, e = np.maximum(iv[0], start), np.minimum(iv[1], end)
    ok = e > s
    return s[ok], e[ok]
