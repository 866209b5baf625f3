"""Column (numpy) form of what the trace reader keeps, for the vectorised timeline analysis.

The fast reader (:mod:`ampdiag.trace.fastread`) builds these columns directly; the
standard-library reader builds lists of tuples, turned into columns by :func:`from_lists` when
the analysis first asks for them. Either way the analysis sees the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    F64 = NDArray[np.float64]
    I64 = NDArray[np.int64]

GPU_KINDS = ("kernel", "memcpy", "memset")
HOST_CATEGORIES = (
    *("forward", "backward", "optimizer", "data"),
    *("all_reduce", "collective", "comm_op", "micro_batch"),
)
"""Host categories of ``host_cat``: the step breakdown's (without "other"), then the
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
        import numpy as np

        lc = self.launch_corr
        if not len(lc):
            return np.full(len(corr), -1, dtype=np.int64)
        i = np.searchsorted(lc, corr)
        i = np.minimum(i, len(lc) - 1)
        return np.where(lc[i] == corr, i, -1).astype(np.int64)

    def take_gpu(self, mask: Any) -> Columns:
        """A copy with only the GPU activities selected by ``mask`` (bool array or indices)."""
        return Columns(
            names=self.names,
            gpu_ts=self.gpu_ts[mask],
            gpu_dur=self.gpu_dur[mask],
            gpu_stream=self.gpu_stream[mask],
            gpu_corr=self.gpu_corr[mask],
            gpu_name=self.gpu_name[mask],
            gpu_kind=self.gpu_kind[mask],
            launch_corr=self.launch_corr,
            launch_ts=self.launch_ts,
            launch_dur=self.launch_dur,
            launch_name=self.launch_name,
            host_start=self.host_start,
            host_end=self.host_end,
            host_cat=self.host_cat,
            host_pid=self.host_pid,
            pids=self.pids,
        )

    # -- back to the reader's tuples (tests and the standard-library path's interface) --

    def gpu_tuples(self) -> list[tuple[float, float, int, int, str, str]]:
        """``RankTrace.gpu`` rows: (start_us, dur_us, stream, correlation, name, kind)."""
        names = self.names
        return [
            (t, d, s, c, names[n], GPU_KINDS[k])
            for t, d, s, c, n, k in zip(
                self.gpu_ts.tolist(),
                self.gpu_dur.tolist(),
                self.gpu_stream.tolist(),
                self.gpu_corr.tolist(),
                self.gpu_name.tolist(),
                self.gpu_kind.tolist(),
                strict=True,
            )
        ]

    def launch_dict(self) -> dict[int, tuple[float, float, str]]:
        """``RankTrace.launches``: correlation -> (start_us, dur_us, name)."""
        names = self.names
        return {
            c: (t, d, names[n])
            for c, t, d, n in zip(
                self.launch_corr.tolist(),
                self.launch_ts.tolist(),
                self.launch_dur.tolist(),
                self.launch_name.tolist(),
                strict=True,
            )
        }

    def host_tuples(self) -> list[tuple[float, float, str, Any]]:
        """``RankTrace.host`` rows: (start_us, end_us, category, pid)."""
        pids = self.pids
        return [
            (s, e, HOST_CATEGORIES[c], pids[p])
            for s, e, c, p in zip(
                self.host_start.tolist(),
                self.host_end.tolist(),
                self.host_cat.tolist(),
                self.host_pid.tolist(),
                strict=True,
            )
        ]


def _f64(values: Any) -> F64:
    import numpy as np

    return np.asarray(values, dtype=np.float64).reshape(-1)


def _i64(values: Any) -> I64:
    import numpy as np

    return np.asarray(values, dtype=np.int64).reshape(-1)


def from_lists(
    gpu: list[tuple[float, float, int, int, str, str]],
    launches: dict[int, tuple[float, float, str]],
    host: list[tuple[float, float, str, Any]],
) -> Columns:
    """Columns from the reader's lists (the standard-library path, or lists a test set).

    Correlation ids are replaced by dense keys (they may exceed 64 bits in odd traces); only
    their equality matters to the analysis. GPU activities are sorted by start (stable).
    """
    names: dict[str, int] = {}
    launch_items = sorted(launches.items(), key=lambda kv: kv[0])
    corr_key = {c: i for i, (c, _) in enumerate(launch_items)}
    gpu = sorted(gpu, key=lambda g: g[0])
    kind_index = {k: i for i, k in enumerate(GPU_KINDS)}
    cat_index = {c: i for i, c in enumerate(HOST_CATEGORIES)}
    pid_index: dict[str, int] = {}
    host = [h for h in host if h[2] in cat_index]
    gpu_name = _i64([names.setdefault(g[4], len(names)) for g in gpu])
    launch_name = _i64([names.setdefault(v[2], len(names)) for _, v in launch_items])
    host_pid = _i64([pid_index.setdefault(str(h[3]), len(pid_index)) for h in host])
    return Columns(
        names=list(names),
        gpu_ts=_f64([g[0] for g in gpu]),
        gpu_dur=_f64([g[1] for g in gpu]),
        gpu_stream=_i64([g[2] if -(1 << 63) <= g[2] < 1 << 63 else -1 for g in gpu]),
        gpu_corr=_i64([corr_key.get(g[3], -1) for g in gpu]),
        gpu_name=gpu_name,
        gpu_kind=_i64([kind_index[g[5]] for g in gpu]),
        launch_corr=_i64(list(range(len(launch_items)))),
        launch_ts=_f64([v[0] for _, v in launch_items]),
        launch_dur=_f64([v[1] for _, v in launch_items]),
        launch_name=launch_name,
        host_start=_f64([h[0] for h in host]),
        host_end=_f64([h[1] for h in host]),
        host_cat=_i64([cat_index[h[2]] for h in host]),
        host_pid=host_pid,
        pids=list(pid_index),
    )
