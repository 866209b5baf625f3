"""The interval algebra against a direct count: integer intervals, unit cells counted one by one."""

from __future__ import annotations

import numpy as np

from ampdiag.analysis import intervals as iv

RNG = np.random.default_rng(0)


def _random(n: int, span: int = 200) -> tuple[np.ndarray, np.ndarray]:
    starts = RNG.integers(0, span, n).astype(np.float64)
    return starts, starts + RNG.integers(0, 30, n)


def _cells(starts: np.ndarray, ends: np.ndarray, span: int = 260) -> np.ndarray:
    """Which unit cells [t, t+1) any interval covers: the count made without a sweep."""
    covered = np.zeros(span, dtype=bool)
    for s, e in zip(starts.astype(int), ends.astype(int), strict=True):
        covered[s:e] = True
    return covered


def test_union_and_total_cover_the_cells_the_intervals_cover() -> None:
    for n in (0, 1, 5, 60):
        s, e = _random(n)
        u = iv.union(s, e)
        assert iv.total(u) == _cells(s, e).sum()
        assert iv.sorted_disjoint(*u) and np.all(u[1] >= u[0])


def test_coverage_counts_each_combination_of_groups() -> None:
    groups = [_random(20) for _ in range(3)]
    cov = iv.coverage([iv.union(*g) for g in groups])
    cells = [_cells(*g) for g in groups]
    for mask in range(1, 8):
        want = np.ones(260, dtype=bool)
        for k in range(3):
            want &= cells[k] if mask & (1 << k) else ~cells[k]
        assert cov[mask] == want.sum(), mask
    a, b = (iv.union(*g) for g in groups[:2])
    assert iv.intersect(a, b) == (cells[0] & cells[1]).sum()


def test_covered_by_group_is_each_groups_union() -> None:
    s, e = _random(80)
    group = RNG.integers(0, 4, 80)
    got = iv.covered_by_group(group, s, e, 4)
    for g in range(4):
        assert got[g] == _cells(s[group == g], e[group == g]).sum()


def test_step_pairs_are_the_overlapping_interval_step_pairs() -> None:
    s, e = _random(40)
    steps_s = np.arange(0, 240, 20, dtype=np.float64)
    steps_e = steps_s + 15
    u_s, u_e = iv.union(s, e)
    step, span = iv.step_pairs(u_s, u_e, steps_s, steps_e)
    got = set(zip(span.tolist(), step.tolist(), strict=True))
    want = {
        (i, k)
        for i in range(len(u_s))
        for k in range(len(steps_s))
        if u_s[i] < steps_e[k] and u_e[i] > steps_s[k]
    }
    assert got == want


def test_clip_cuts_to_the_window() -> None:
    s, e = iv.clip((np.array([0.0, 5.0, 9.0]), np.array([4.0, 8.0, 12.0])), 3.0, 10.0)
    assert s.tolist() == [3.0, 5.0, 9.0] and e.tolist() == [4.0, 8.0, 10.0]
