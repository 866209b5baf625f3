"""Time figures with their spread, and thresholds compared against the interval, not one sample.

A time measured on a shared machine is a distribution, not a number: another process, a page
fault or a garbage collection adds to one sample and not to the next. A finding decided by one
sample (or by a mean that one stalled step drives) flips between identical runs. So every
timing figure ampdiag reports is the **median** of repeated samples with its **spread**, the
median absolute deviation (MAD): half of the samples lie within median ± MAD, and one stalled
sample among three moves neither (both break down only when half the samples are bad, where a
mean or the interquartile range break with the first one).

A threshold is then compared with the interval ``[median - MAD, median + MAD]``: the claim is
made when the whole interval is beyond it, dropped when the whole interval is short of it, and
reported as uncertain (with the interval, so the reader sees why) when the interval straddles
it. Passes of one computation repeated back to back (the precision A/B) are summed up by
their **least** sample instead (`least`): there the disturbance is one-sided. Torch-free:
rules and collectors both read it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Side = Literal["above", "below", "uncertain"]

#: Fewer samples than this give no interval: a claim needs at least two measurements.
MIN_SAMPLES = 2
#: Fewer samples than this are never called tight (two agreeing samples may agree by chance).
MIN_TIGHT_SAMPLES = 3


@dataclass(frozen=True)
class Estimate:
    """A median with the interval around it (median ± MAD for measured samples).

    Attributes:
        median: The median sample (or the quotient of two medians, `quotient`).
        low: The interval's lower end.
        high: The interval's upper end.
        samples: How many samples it rests on (the fewer, for a quotient).
    """

    median: float
    low: float
    high: float
    samples: int

    @property
    def spread(self) -> float:
        """Half the interval's width (the MAD, for measured samples)."""
        return (self.high - self.low) / 2

    def relative_spread(self) -> float:
        """The spread as a share of the median (infinite for a zero median)."""
        return self.spread / abs(self.median) if self.median else math.inf

    def versus(self, threshold: float) -> Side:
        """Whether the whole interval is at or above ``threshold``, below it, or straddles it.

        With fewer than `MIN_SAMPLES` samples nothing is known: "uncertain".
        """
        if self.samples < MIN_SAMPLES:
            return "uncertain"
        if self.low >= threshold:
            return "above"
        if self.high < threshold:
            return "below"
        return "uncertain"


def why_uncertain(est: Estimate, threshold: float, what: str, fmt: str) -> str:
    """Why an "uncertain" estimate is: too few samples, or its interval straddles the threshold.

    ``what`` names one sample ("timed pair", "profiled step"); ``fmt`` formats a value
    (``"{:.2f}x"``, ``"{:.0%}"``).
    """
    if est.samples < MIN_SAMPLES:
        return f"a single {what} gives no interval"
    return (
        f"its interval {fmt.format(est.low)}-{fmt.format(est.high)} straddles the "
        f"{fmt.format(threshold)} threshold"
    )


def estimate(samples: Sequence[float]) -> Estimate:
    """The median of ``samples`` (at least one) and the interval median ± MAD."""
    values = [float(s) for s in samples]
    if not values:
        raise ValueError("estimate() needs at least one sample")
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    return Estimate(mid, mid - mad, mid + mad, len(values))


def least(samples: Sequence[float]) -> Estimate:
    """The least of ``samples`` (at least one), with the interval up to the second least.

    For one computation timed again and again (the precision A/B), where load only adds time
    (a 1 ms pass that waits out a 4 ms time slice measures 5 ms), the least is the least
    disturbed and right while one pass ran undisturbed; a median needs over half of them. Two
    undisturbed passes agree: a wide gap to the second least says the least may be alone.
    """
    values = sorted(float(s) for s in samples)
    if not values:
        raise ValueError("least() needs at least one sample")
    return Estimate(values[0], values[0], values[min(1, len(values) - 1)], len(values))


def quotient(num: Estimate, den: Estimate) -> Estimate:
    """``num / den`` with the interval their intervals allow (low over high, high over low).

    A ratio of two medians (or of two least times, `least`), not a median of per-pair
    ratios: a stall corrupts a pair whichever of its two samples it hits, so per-pair ratios
    go wrong twice as often as either median.
    """
    if den.median <= 0:
        raise ValueError("quotient() needs a positive denominator")
    high = num.high / den.low if den.low > 0 else math.inf
    return Estimate(
        num.median / den.median, num.low / den.high, high, min(num.samples, den.samples)
    )


def tight(est: Estimate, tolerance: float) -> bool:
    """Whether the estimate is known to within ``tolerance`` of its median.

    The stopping rule of repeated timing; it needs at least `MIN_TIGHT_SAMPLES` samples.
    """
    return est.samples >= MIN_TIGHT_SAMPLES and est.relative_spread() <= tolerance
