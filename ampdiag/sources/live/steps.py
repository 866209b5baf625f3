"""The per-step records of a live run, a few bytes per step, with losses read in batches.

A long run must stay flat: keeping each step's loss tensor (and a Python object per step)
until the end grows the process by about a kilobyte per step. Here each step is a row of
typed arrays, and the loss tensors of the last `BATCH` steps are packed into one tensor and
copied to the host together (on CUDA without waiting: the values are read a batch later), so
there is no host sync per step and at most two batches of tensors are alive at a time. And
the records are bounded: past ``max_steps_recorded`` they are thinned (`ThinnedRows`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from typing import Any

import torch

from ampdiag.schema import Step
from ampdiag.sources.live.collectors._host import Deferred, pack

BATCH = 64
_PROFILED, _SAMPLED, _HAS_LOSS = 1, 2, 4


class ThinnedRows:
    """Rows of numbers keyed by step, in typed columns, at most ``cap`` rows, spread evenly.

    When ``cap`` rows are reached, every other one is dropped and from then on only every
    ``stride``-th step (the stride doubles each time) is kept: the rows span the whole run,
    however long it is, in bounded memory. ``before_thin`` runs first (to settle row numbers
    something else holds).
    """

    def __init__(
        self, cap: int, typecodes: str, before_thin: Callable[[], None] | None = None
    ) -> None:
        self.cap = max(2, cap)
        self.stride = 1
        self.index = array("q")
        self.columns: list[array[Any]] = [array(code) for code in typecodes]
        self._before_thin = before_thin

    def __len__(self) -> int:
        return len(self.index)

    def add(self, index: int, *values: float) -> int | None:
        """Adds the row of step ``index``; returns its row number, or None if not kept."""
        if index % self.stride:
            return None
        if len(self.index) >= self.cap:
            self._thin()
            if index % self.stride:
                return None
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)
        self.index.append(index)
        return len(self.index) - 1

    def _thin(self) -> None:
        if self._before_thin is not None:
            self._before_thin()
        self.stride *= 2
        keep = [i for i, index in enumerate(self.index) if index % self.stride == 0]
        self.index = array("q", (self.index[i] for i in keep))
        self.columns = [array(c.typecode, (c[i] for i in keep)) for c in self.columns]


class StepLog:
    """The steps' records (`ThinnedRows` of ``cap``), losses copied to the host in batches."""

    def __init__(self, cap: int) -> None:
        # Columns: wall_s, loss (NaN until read), flags, micro-batches (-1: no model known).
        self._rows = ThinnedRows(cap, "ddBq", before_thin=self._settle)
        # The step in progress: sums of the losses given to GradScaler.scale, and of those
        # passed to backward (on the device: no sync).
        self._scaled: torch.Tensor | None = None
        self._plain: torch.Tensor | None = None
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._inflight: list[tuple[list[int], Deferred]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def saw_loss(self, loss: torch.Tensor, from_scaler: bool) -> None:
        """Adds a loss of the step in progress (detached here) to its sum.

        The step's loss is the sum of its micro-batches' losses as backpropagated (with ``loss / N``
        each, their mean: docs/how-it-works.md, Gradient accumulation), the unscaled ones given to
        GradScaler.scale preferred over the scaled ones passed to backward.
        """
        if not from_scaler and self._scaled is not None:
            return  # the step's loss is the scaled sum's now: this one would never be read
        value = loss.detach()
        value = value if value.dim() == 0 else value.reshape(())
        if value.dtype != torch.float32:  # no call into torch for the usual FP32 loss
            value = value.float()
        if from_scaler:
            self._scaled = value if self._scaled is None else self._scaled + value
        else:
            self._plain = value if self._plain is None else self._plain + value

    def has_activity(self) -> bool:
        """Whether the step in progress saw a loss."""
        return self._scaled is not None or self._plain is not None

    def end(
        self,
        index: int,
        wall_s: float,
        profiled: bool,
        sampled: bool,
        micro_batches: int | None = None,
    ) -> None:
        """Records a step that ended (when `ThinnedRows` keeps its row)."""
        current = self._scaled if self._scaled is not None else self._plain
        self._scaled = self._plain = None
        flags = (_PROFILED if profiled else 0) | (_SAMPLED if sampled else 0)
        micro = -1 if micro_batches is None else micro_batches
        row = self._rows.add(index, wall_s, math.nan, flags, micro)
        if row is not None and current is not None:
            self._pending.append((row, current))
            if len(self._pending) >= BATCH:
                self._flush()
        self._absorb(wait=False)

    def _settle(self) -> None:
        """Reads every loss in flight (before the rows are renumbered)."""
        self._flush()
        self._absorb(wait=True)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        losses = [t for _, t in pending]
        try:
            try:  # one call: each loss is a detached 0-dim FP32 tensor (`saw_loss`)
                packed = torch.stack(losses)
            except RuntimeError:  # on different devices
                packed = pack(losses, losses[0].device)
            self._inflight.append(([row for row, _ in pending], Deferred(packed, copy=False)))
        except Exception:  # a loss that cannot be read (a meta tensor): no value, no failure
            pass

    def _absorb(self, wait: bool) -> None:
        keep = []
        for rows, deferred in self._inflight:
            if not (wait or deferred.ready()):
                keep.append((rows, deferred))
                continue
            _, loss, flags, _ = self._rows.columns
            for row, value in zip(rows, deferred.values(), strict=False):
                loss[row] = value
                flags[row] |= _HAS_LOSS
        self._inflight = keep

    def records(self) -> list[Step]:
        """The steps' JSON records (waits for the last copies)."""
        self._flush()
        self._absorb(wait=True)
        wall, loss, flags, micro = self._rows.columns
        return [
            {
                "index": index,
                "wall_s": wall[i],
                "loss": loss[i] if flags[i] & _HAS_LOSS else None,
                "profiled": bool(flags[i] & _PROFILED),
                "sampled": bool(flags[i] & _SAMPLED),
                "micro_batches": micro[i] if micro[i] >= 0 else None,
            }
            for i, index in enumerate(self._rows.index)
        ]
