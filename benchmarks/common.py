"""Helpers shared by the benchmarks: median, interleaved rounds, a compact table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def ratio_line(name: str, ours: Sequence[float], base: Sequence[float], unit: str = "ms") -> str:
    scale = 1000.0 if unit == "ms" else 1.0
    m_ours, m_base = median(ours), median(base)
    return (
        f"{name}: ours {m_ours * scale:.2f} {unit}, baseline {m_base * scale:.2f} {unit}, "
        f"median ratio {m_ours / m_base:.3f}x (n={len(ours)})"
    )
