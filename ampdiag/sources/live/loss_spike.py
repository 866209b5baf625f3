"""When is a step's loss a spike? A robust bound over the loss's recent history.

Training losses are noisy, trend down, and now and then jump: a bad batch, a learning-rate
warm-up ending, the first steps of a divergence. A bound from the mean and standard deviation
of the history is dragged up by the very spikes it should catch, so the bound here is robust:
the median ``m`` of the last `HISTORY` finite losses and their median absolute deviation
(MAD, times 1.4826: the standard deviation of normally distributed noise), and a loss is a
spike when

    loss > m + `K` x max(1.4826 x MAD, `FLOOR` x |m|)

or when it is not finite. The floor keeps a flat loss (MAD near 0) from calling every tiny
wobble a spike: a spike is then at least ``K x FLOOR`` = 30% above the median. Nothing is
called a spike before `MIN_HISTORY` finite losses were seen. A spike enters the history like
any finite loss (the median and the MAD hardly move for one outlier), so a lasting change of
level becomes the new normal within half the history instead of being a spike forever. No
torch here: values are floats.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median

#: Finite losses the bound is computed over (the most recent).
HISTORY = 32
#: Finite losses needed before anything is a spike.
MIN_HISTORY = 8
#: How many robust standard deviations above the median a spike is.
K = 6.0
#: The spread's floor, as a share of the median's magnitude.
FLOOR = 0.05
#: MAD to the standard deviation of normal noise.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Spike:
    """A loss beyond the bound: what it was and what the bound rested on."""

    step: int
    loss: float
    bound: float
    median: float
    mad: float
    history: int

    def to_dict(self) -> dict[str, float | int | None]:
        """As the session stores it (a non-finite value as None: JSON has no NaN)."""
        return {
            "step": self.step,
            "loss": self.loss if math.isfinite(self.loss) else None,
            "nonfinite": not math.isfinite(self.loss),
            "bound": self.bound if math.isfinite(self.bound) else None,
            "median": self.median if math.isfinite(self.median) else None,
            "mad": self.mad if math.isfinite(self.mad) else None,
            "history": self.history,
        }


class SpikeDetector:
    """Feeds on one loss per step; says which one is a spike (see the module doc)."""

    def __init__(self) -> None:
        self._history: deque[float] = deque(maxlen=HISTORY)

    def bound(self) -> tuple[float, float, float] | None:
        """(bound, median, MAD) of the history now, or None while it is too short."""
        if len(self._history) < MIN_HISTORY:
            return None
        m = median(self._history)
        mad = median(abs(v - m) for v in self._history)
        spread = max(MAD_TO_SIGMA * mad, FLOOR * abs(m))
        return m + K * spread, m, mad

    def add(self, step: int, loss: float) -> Spike | None:
        """Adds step ``step``'s loss; returns the `Spike` when it is one."""
        limits = self.bound()
        if not math.isfinite(loss):
            if limits is None:
                return Spike(step, loss, math.nan, math.nan, math.nan, len(self._history))
            return Spike(step, loss, *limits, len(self._history))
        seen = len(self._history)
        self._history.append(loss)
        if limits is not None and loss > limits[0]:
            return Spike(step, loss, *limits, seen)
        return None
