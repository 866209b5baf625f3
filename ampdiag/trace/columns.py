"""Column (numpy) form of what the trace reader keeps, for the vectorised timeline analysis.

The column builder (:mod:`ampdiag.trace.builder`) makes them for every file, whichever path
decoded it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

GPU_KINDS = ("kernel", "memcpy", "memset")
HOST_CATEGORIES = (
    *("forward", "backward", "optimizer", "data", "closure"),
    *("all_reduce", "collective", "comm_op", "micro_batch"),
)
"""Host categories of ``host_cat``: the step breakdown's (without "other"; "closure" marks an
optimizer's ``step(closure)`` forward and backward, which are not optimizer time), then the
communication ones `ampdiag.trace.step_breakdown.classify` tells apart."""


@dataclass
class Columns:
    """GPU activities, host launch calls and host spans of one trace, as arrays.

    Attributes:
        names: Distinct GPU activity (and launch) names; ``gpu_name`` / ``launch_name`` index it.
        gpu_ts: Start of each GPU activity (us), sorted ascending (stable in reading order).
        gpu_dur: Its duration (us).
        gpu_stream: Its ``args.stream`` (-1 when absent).
        gpu_corr: Correlation key matching ``launch_corr`` (-1: no launch can match).
        gpu_name: Index into ``names``.
        gpu_kind: Index into ``GPU_KINDS``.
        launch_corr: Correlation keys of launch calls, sorted, unique.
        launch_ts: Start of each launch call (us).
        launch_dur: Its duration (us).
        launch_name: Index into ``names``.
        host_start: Start of each host span the step breakdown counts (us).
        host_end: Its end (us).
        host_cat: Index into ``HOST_CATEGORIES``.
        host_pid: Index into ``pids``.
        pids: Distinct process ids (as strings).
    """

    names: list[str]
    gpu_ts: F64
    gpu_dur: F64
    gpu_stream: I64
    gpu_corr: I64
    gpu_name: I64
    gpu_kind: I64
    launch_corr: I64
    launch_ts: F64
    launch_dur: F64
    launch_name: I64
    host_start: F64
    host_end: F64
    host_cat: I64
    host_pid: I64
    pids: list[str]

    def launch_index(self, corr: I64) -> I64:
        """Index into the launch columns of each correlation key, -1 where there is none."""
        lc = self.launch_corr
        if not len(lc):
            return np.full(len(corr), -1, dtype=np.int64)
        i = np.searchsorted(lc, corr)
        i = np.minimum(i, len(lc) - 1)
        return np.where(lc[i] == corr, i, -1).astype(np.int64)

    def take_gpu(self, mask: Any) -> Columns:
        """A copy with only the GPU activities selected by ``mask`` (bool array or indices)."""
        return replace(self, **{k: getattr(self, k)[mask] for k in _GPU_COLUMNS})


_GPU_COLUMNS = ("gpu_ts", "gpu_dur", "gpu_stream", "gpu_corr", "gpu_name", "gpu_kind")
