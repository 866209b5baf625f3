"""Reading Kineto traces (torch.profiler's Chrome-trace JSON): what is kept, and which path reads.

The reader keeps only what the timeline analysis needs: GPU activities (kernels, memcpy,
memset), the host-side launch calls (``cudaLaunchKernel`` and friends, matched to the GPU by
correlation id), ``ProfilerStep#N`` spans, the host events the step breakdown classifies, and
per-name totals of CPU ops (:class:`RankTrace`). Nothing else is kept, so memory stays a small
fraction of the JSON's size.

:func:`read_trace` takes the fast path where msgspec is installed (:mod:`ampdiag.trace.fastread`,
several processes for a large file: :mod:`ampdiag.trace.parallel`), and the standard-library
path (:mod:`ampdiag.trace.stdlib_reader`) for anything the fast path does not handle; both give
the same records, and bad input the same one-line errors.

Variations accepted: float (nanosecond-precision) timestamps, missing ``distributedInfo`` or
rank (taken from the file name, else the file's position), legacy category names (``Kernel``,
``Memcpy``, ``Memset``, ``Runtime``, ``Operator``), CPU-only traces. Events with missing or
non-finite times or a negative duration are skipped and counted in ``warnings``. A file that is
not a Kineto trace, or not valid JSON, raises :class:`~ampdiag.errors.InputError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampdiag.trace.columns import Columns

FAST = True
"""Try the msgspec fast path first (:mod:`ampdiag.trace.fastread`) where msgspec is installed."""

KERNEL_CATS = frozenset({"kernel", "Kernel"})
MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
GPU_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS
LAUNCH_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "privateuse1_runtime"})
HOST_OP_CATS = frozenset({"cpu_op", "Operator", "operator"})
ANNOTATION_CATS = frozenset({"user_annotation", "python_function"})
_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class Fallback(Exception):
    """The fast path met something it does not handle; read the file with the general reader."""


GpuActivity = tuple[float, float, int, int, str, str]
"""(start_us, dur_us, stream, correlation, name, kind) with kind kernel|memcpy|memset."""


class RankTrace:
    """What the reader kept of one trace file.

    ``gpu``, ``launches`` and ``host`` are lists/dicts of tuples; the fast reader stores them as
    numpy columns (:class:`~ampdiag.trace.columns.Columns`) and makes the tuples only when
    they are asked for. Assigning one of them replaces the columns.

    Attributes:
        path: The file.
        rank: ``distributedInfo.rank``, else a rank in the file name, else the file's index.
        rank_source: Where the rank came from: "distributedInfo", "file name" or "position".
        world_size: ``distributedInfo.world_size`` where present.
        devices: Names of the GPUs in ``deviceProperties`` (empty for CPU-only traces).
        gpu: GPU activities (see ``GpuActivity``), sorted by start.
        launches: Correlation id -> (start_us, dur_us, name) of the host launch call.
        steps: ``(N, start_us, end_us, pid)`` for each ``ProfilerStep#N``.
        host: ``(start_us, end_us, category, pid)`` of host events the step breakdown counts.
        cpu_ops: CPU op name -> [calls, inclusive_us].
        events: Number of trace events read.
        skipped: Reason -> number of events skipped for it.
        meta: Other top-level keys (small values only).
        reader: "fast" (msgspec) or "stdlib", the path that read the file.
        processes: How many processes read the file (see :mod:`ampdiag.trace.parallel`).
        worker_peak_bytes: Each worker process's peak memory, less the pages it shared with
            this process (``parallel.own_peak_bytes``).
    """

    def __init__(
        self,
        path: Path,
        rank: int = 0,
        rank_source: str = "position",
        world_size: int | None = None,
        devices: list[str] | None = None,
        gpu: list[GpuActivity] | None = None,
        launches: dict[int, tuple[float, float, str]] | None = None,
        steps: list[tuple[int, float, float, Any]] | None = None,
        host: list[tuple[float, float, str, Any]] | None = None,
        cpu_ops: dict[str, list[float]] | None = None,
        events: int = 0,
        skipped: dict[str, int] | None = None,
        meta: dict[str, Any] | None = None,
        columns: Columns | None = None,
    ) -> None:
        self.path = path
        self.rank = rank
        self.rank_source = rank_source
        self.world_size = world_size
        self.devices = devices if devices is not None else []
        self.steps = steps if steps is not None else []
        self.cpu_ops = cpu_ops if cpu_ops is not None else {}
        self.events = events
        self.skipped = skipped if skipped is not None else {}
        self.meta = meta if meta is not None else {}
        self.reader = "stdlib"
        self.processes = 1
        self.worker_peak_bytes: list[int] = []
        self._cols = columns
        self._gpu = gpu if gpu is not None or columns is not None else []
        self._launches = launches if launches is not None or columns is not None else {}
        self._host = host if host is not None or columns is not None else []

    def _materialise(self) -> None:
        cols = self._cols
        if cols is None:
            return
        if self._gpu is None:
            self._gpu = cols.gpu_tuples()
        if self._launches is None:
            self._launches = cols.launch_dict()
        if self._host is None:
            self._host = cols.host_tuples()

    @property
    def gpu(self) -> list[GpuActivity]:
        """GPU activities (see ``GpuActivity``)."""
        if self._gpu is None:
            self._materialise()
        assert self._gpu is not None
        return self._gpu

    @gpu.setter
    def gpu(self, value: list[GpuActivity]) -> None:
        self._materialise()
        self._cols, self._gpu = None, value

    @property
    def launches(self) -> dict[int, tuple[float, float, str]]:
        """Correlation id -> (start_us, dur_us, name) of the host launch call."""
        if self._launches is None:
            self._materialise()
        assert self._launches is not None
        return self._launches

    @launches.setter
    def launches(self, value: dict[int, tuple[float, float, str]]) -> None:
        self._materialise()
        self._cols, self._launches = None, value

    @property
    def host(self) -> list[tuple[float, float, str, Any]]:
        """(start_us, end_us, category, pid) of host events the step breakdown counts."""
        if self._host is None:
            self._materialise()
        assert self._host is not None
        return self._host

    @host.setter
    def host(self, value: list[tuple[float, float, str, Any]]) -> None:
        self._materialise()
        self._cols, self._host = None, value

    def columns(self) -> Columns:
        """The GPU, launch and host records as numpy columns (built once, then kept)."""
        if self._cols is None:
            from ampdiag.trace.columns import from_lists  # numpy: imported when first needed

            self._cols = from_lists(self.gpu, self.launches, self.host)
        return self._cols

    @property
    def has_gpu(self) -> bool:
        """Whether any GPU activity was read."""
        if self._gpu is not None:
            return bool(self._gpu)
        return bool(self._cols is not None and len(self._cols.gpu_ts))

    @property
    def gpu_count(self) -> int:
        """Number of GPU activities read."""
        if self._gpu is not None:
            return len(self._gpu)
        return len(self._cols.gpu_ts) if self._cols is not None else 0

    @property
    def warnings(self) -> list[str]:
        """Human-readable lines about what was skipped."""
        return [f"{n} event(s) skipped: {why}" for why, n in sorted(self.skipped.items())]


def read_trace(path: str | Path, index: int = 0) -> RankTrace:
    """Reads one Kineto trace file.

    Args:
        path: A ``.json`` or ``.json.gz`` trace (gzip is detected from the content).
        index: The file's position among the ranks (the rank of last resort).

    Returns:
        The RankTrace.

    Raises:
        InputError: Unreadable, not JSON, truncated, or not a Kineto trace.
    """
    p = Path(path)
    if FAST:
        from ampdiag.trace import parallel

        try:
            return parallel.read_fast(p, index)
        except (Fallback, ImportError):  # odd input; or msgspec is not installed
            pass
    return read_trace_stdlib(p, index)


def read_traces(paths: list[Path]) -> Iterator[RankTrace]:
    """Reads trace files in order, ``paths[i]`` as rank of last resort ``i``.

    Several files are read at once by worker processes where that pays
    (:mod:`ampdiag.trace.parallel_files`); the records are those of :func:`read_trace` on each.

    Raises (while iterating):
        InputError: A file is unreadable, not JSON, truncated, or not a Kineto trace.
    """
    if FAST:
        from ampdiag.trace import parallel_files

        many = parallel_files.read_files(paths)
        if many is not None:
            yield from many
            return
    for index, path in enumerate(paths):
        yield read_trace(path, index)


def read_trace_stdlib(path: str | Path, index: int = 0) -> RankTrace:
    """Reads one trace file with the standard-library path only (see :func:`read_trace`)."""
    from ampdiag.trace.stdlib_reader import read_stdlib

    return read_stdlib(Path(path), index)


def _meta_value(out: RankTrace, key: str, val: Any) -> None:
    """Keeps what the analysis needs of a top-level key other than traceEvents."""
    if key in ("distributedInfo", "deviceProperties", "schemaVersion", "traceName"):
        out.meta[key] = val
    elif key in ("schema", "nodes"):
        out.meta[key] = True


def apply_meta(out: RankTrace, index: int) -> None:
    """Rank, world size and devices from the top-level keys read; steps sorted by start."""
    dist = out.meta.get("distributedInfo")
    rank = dist.get("rank") if isinstance(dist, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 31:
        out.rank, out.rank_source = rank, "distributedInfo"
    else:
        m = _RANK_IN_NAME.search(out.path.name)
        if m and len(m.group(1)) < 10:
            out.rank, out.rank_source = int(m.group(1)), "file name"
        else:
            out.rank, out.rank_source = index, "position"
    world = dist.get("world_size") if isinstance(dist, dict) else None
    if isinstance(world, int) and not isinstance(world, bool) and 0 < world < 1 << 31:
        out.world_size = world
    props = out.meta.get("deviceProperties")
    if isinstance(props, list):
        out.devices = [str(d.get("name", "?")) for d in props if isinstance(d, dict)]
    out.steps.sort(key=lambda s: s[1])
    if out._gpu is not None:
        out._gpu.sort(key=lambda g: g[0])
