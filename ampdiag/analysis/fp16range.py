"""FP16's range, and what a binary-exponent histogram says about values held in it (pure Python).

The collectors count values by their float32 exponent field ``e`` (0..255, see
``ampdiag.sources.live.collectors._exponents``): bin 0 holds zeros (and float32
subnormals, below 2^-126),
bin 255 holds inf/NaN, and bin ``e`` in 1..254 holds |x| in [2^(e-127), 2^(e-126)). Multiplying
by a power-of-two loss scale 2^s moves a value from bin e to e+s exactly, so a histogram taken
once predicts, exactly, what FP16 would hold at any other power-of-two scale:

* flushed to zero:  |x·2^s| < 2^-24 (FP16's smallest subnormal)
* subnormal:        |x·2^s| < 2^-14 (FP16's smallest normal; this count includes the flushed)
* overflow:         |x·2^s| >= 2^16 (FP16's largest finite is 65504; values from 65520 round
  to inf, so the [65520, 65536) sliver is the one place this count can miss)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

FP16_MAX = 65504.0
FP16_MIN_NORMAL_LOG2 = -14
FP16_MIN_SUBNORMAL_LOG2 = -24
FP16_OVERFLOW_LOG2 = 16
BIAS = 127
#: Candidate loss scales (log2) the predictions are made for (the report's table).
CANDIDATE_LOG2 = tuple(range(25))
#: Loss scales (log2) searched for the recommended init_scale: far beyond 2^24 (tiny losses
#: need it), up to where FP32 itself would overflow the scaled loss.
SEARCH_LOG2 = tuple(range(121))
#: The recommended init_scale keeps the predicted zero-or-subnormal share under this.
UNDERFLOW_TARGET = 0.01


def exponent_counts(hist: Sequence[float]) -> dict[int, int]:
    """Sparse {log2 exponent: count} of the normal bins of a 256-bin raw histogram."""
    return {e - BIAS: int(c) for e, c in enumerate(hist) if 0 < e < 255 and c}


def range_counts(hist: Sequence[float], shift: int = 0) -> dict[str, int]:
    """Counts of a 256-bin raw exponent histogram as FP16 would hold the values times 2^shift.

    Returns:
        n, zero, nonfinite, flush (|x| < 2^-24, nonzero), subnormal (|x| < 2^-14, nonzero,
        includes flush), overflow (|x| >= 2^16, finite).
    """
    out = {"n": 0, "zero": 0, "nonfinite": 0, "flush": 0, "subnormal": 0, "overflow": 0}
    for e, c in enumerate(hist):
        c = int(c)
        if not c:
            continue
        out["n"] += c
        if e == 0:
            out["zero"] += c
        elif e == 255:
            out["nonfinite"] += c
        else:
            log2 = e - BIAS + shift
            if log2 < FP16_MIN_SUBNORMAL_LOG2:
                out["flush"] += c
            if log2 < FP16_MIN_NORMAL_LOG2:
                out["subnormal"] += c
            if log2 >= FP16_OVERFLOW_LOG2:
                out["overflow"] += c
    return out


def range_counts_rows(hists: Any, shift: int = 0) -> dict[str, Any]:
    """`range_counts` for every row of a (rows, 256) array at once (numpy; int64 arrays).

    Returns:
        The same keys as `range_counts`, each an int64 array with one value per row.
    """
    import numpy as np

    h = np.asarray(hists, dtype=np.int64).reshape(-1, 256)
    # Normal bin e holds log2 = e - BIAS; with the shift it crosses a limit L at e = L + BIAS - s.
    flush_end = min(max(FP16_MIN_SUBNORMAL_LOG2 + BIAS - shift, 1), 255)
    sub_end = min(max(FP16_MIN_NORMAL_LOG2 + BIAS - shift, 1), 255)
    over_start = min(max(FP16_OVERFLOW_LOG2 + BIAS - shift, 1), 255)
    return {
        "n": h.sum(axis=1),
        "zero": h[:, 0].copy(),
        "nonfinite": h[:, 255].copy(),
        "flush": h[:, 1:flush_end].sum(axis=1),
        "subnormal": h[:, 1:sub_end].sum(axis=1),
        "overflow": h[:, over_start:255].sum(axis=1),
    }


def predict(exponents: Mapping[int, int], scale_log2: int) -> dict[str, float]:
    """Shares of the nonzero finite values (unscaled exponents) FP16 loses at scale 2^k.

    Returns:
        flush, subnormal (zero or subnormal: < 2^-14) and overflow as fractions of the nonzero
        finite values, and ``nonzero`` (their count).
    """
    total = sum(exponents.values())
    if total == 0:
        return {"flush": 0.0, "subnormal": 0.0, "overflow": 0.0, "nonzero": 0}
    flush = sub = over = 0
    for e, c in exponents.items():
        v = int(e) + scale_log2
        if v < FP16_MIN_SUBNORMAL_LOG2:
            flush += c
        if v < FP16_MIN_NORMAL_LOG2:
            sub += c
        if v >= FP16_OVERFLOW_LOG2:
            over += c
    return {
        "flush": flush / total,
        "subnormal": sub / total,
        "overflow": over / total,
        "nonzero": total,
    }


def search_scale_log2(exponents: Mapping[int, int]) -> tuple[int | None, bool]:
    """(k, reached): the smallest scale 2^k that keeps FP16's underflow under 1%.

    The smallest k in `SEARCH_LOG2` whose predicted subnormal share is under
    1% with no overflow, and True; when no k reaches 1%, the k with the smallest share among
    those that do not overflow (ties: the smaller k), and False -- the values span more than
    FP16's range, and no loss scale keeps them (BF16 does). (None, False) when there is
    nothing to go on.
    """
    if not exponents or sum(exponents.values()) == 0:
        return None, False
    best: tuple[float, int] | None = None
    for k in SEARCH_LOG2:
        p = predict(exponents, k)
        if p["overflow"] > 0:
            break  # a larger scale overflows too
        if p["subnormal"] < UNDERFLOW_TARGET:
            return k, True
        if best is None or p["subnormal"] < best[0]:
            best = (p["subnormal"], k)
    return (best[1] if best is not None else 0), False


def recommend_scale_log2(exponents: Mapping[int, int]) -> int | None:
    """The k of `search_scale_log2` (reached or not); None when there is nothing to go on."""
    return search_scale_log2(exponents)[0]


def merge(into: dict[int, int], more: Mapping[int, int] | Mapping[str, int]) -> dict[int, int]:
    """Adds a sparse exponent histogram into another (keys may be JSON strings)."""
    for k, v in more.items():
        key = int(k)
        into[key] = into.get(key, 0) + int(v)
    return into


def log2_or_none(value: float | None) -> int | None:
    """round(log2(value)) for a positive finite value, else None."""
    if value is None or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return round(math.log2(value))
