"""The per-step records of a live run, a few bytes per step, with losses read in batches.

A long run must stay flat: keeping each step's loss tensor (and a Python object per step)
until the end grows the process by about a kilobyte per step. Here each step is a row of
typed arrays, and the loss tensors of the last `BATCH` steps are packed into one tensor and
copied to the host together (on CUDA without waiting: the values are read a batch later), so
there is no host sync per step and at most two batches of tensors are alive at a time.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import torch

from ampdiag.sources.live.collectors._host import Deferred, pack

BATCH = 64
_PROFILED, _SAMPLED, _HAS_LOSS = 1, 2, 4


class StepLog:
    """Steps as typed arrays (the first ``cap`` steps), losses copied to the host in batches."""

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self._index = array("q")
        self._wall = array("d")
        self._loss = array("d")
        self._flags = array("B")
        self._current: tuple[torch.Tensor, bool] | None = None
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._inflight: list[tuple[list[int], Deferred]] = []

    def __len__(self) -> int:
        return len(self._index)

    def saw_loss(self, loss: torch.Tensor, from_scaler: bool) -> None:
        """Notes a loss of the step in progress (the unscaled one given to the scaler wins)."""
        current = self._current
        if current is None or from_scaler or not current[1]:
            self._current = (loss, from_scaler)

    def has_activity(self) -> bool:
        """Whether the step in progress saw a loss."""
        return self._current is not None

    def end(self, index: int, wall_s: float, profiled: bool, sampled: bool) -> None:
        """Records a step that ended (kept while fewer than ``cap`` are recorded)."""
        current, self._current = self._current, None
        if len(self._index) >= self.cap:
            return
        row = len(self._index)
        self._index.append(index)
        self._wall.append(wall_s)
        self._loss.append(math.nan)
        self._flags.append((_PROFILED if profiled else 0) | (_SAMPLED if sampled else 0))
        if current is not None:
            self._pending.append((row, current[0]))
            if len(self._pending) >= BATCH:
                self._flush()
        self._absorb(wait=False)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            packed = pack([t for _, t in pending], pending[0][1].device)
            self._inflight.append(([row for row, _ in pending], Deferred(packed, copy=False)))
        except Exception:  # a loss that cannot be read (a meta tensor): no value, no failure
            pass

    def _absorb(self, wait: bool) -> None:
        keep = []
        for rows, deferred in self._inflight:
            if not (wait or deferred.ready()):
                keep.append((rows, deferred))
                continue
            for row, value in zip(rows, deferred.values(), strict=False):
                self._loss[row] = value
                self._flags[row] |= _HAS_LOSS
        self._inflight = keep

    def records(self) -> list[dict[str, Any]]:
        """The steps' JSON records (waits for the last copies)."""
        self._flush()
        self._absorb(wait=True)
        return [
            {
                "index": self._index[i],
                "wall_s": self._wall[i],
                "loss": self._loss[i] if self._flags[i] & _HAS_LOSS else None,
                "profiled": bool(self._flags[i] & _PROFILED),
                "sampled": bool(self._flags[i] & _SAMPLED),
            }
            for i in range(len(self._index))
        ]
