"""What the trace reader keeps of one file (:class:`RankTrace`), and the categories it routes by.

The bottom layer of :mod:`ampdiag.trace`: the decoder (:mod:`ampdiag.trace.decode`), the lenient
reader (:mod:`ampdiag.trace.lenient`) and the column builder (:mod:`ampdiag.trace.builder`)
import it; it imports none of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ampdiag.trace.columns import Columns

KERNEL_CATS = frozenset({"kernel", "Kernel"})
MTIA_CATS = frozenset({"mtia_ccp_events"})
"""MTIA device work: counted as kernels where it names a stream (HTA's rule; its queue and DMA
request records without one are not device work)."""
MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
GPU_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS | MTIA_CATS
LAUNCH_CATS = frozenset(
    {"cuda_runtime", "Runtime", "cuda_driver", "privateuse1_runtime", "mtia_runtime"}
)
HOST_OP_CATS = frozenset({"cpu_op", "Operator", "operator"})
ANNOTATION_CATS = frozenset({"user_annotation", "python_function"})
# at most 18 digits: a step number always fits an int64 (a 5000-digit one is not a step)
STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d{1,18})$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d{1,9})(?!\d)", re.IGNORECASE)
_META_KEYS = ("distributedInfo", "deviceProperties", "schemaVersion", "traceName")

MemoryEvent = tuple[float, int, int, int]
"""(ts_us, address, bytes (negative: freed), device type) of a ``[memory]`` event."""


class Fallback(Exception):
    """The decoder met a layout it does not cut safely: read the file with the lenient reader."""


class RankTrace:
    """What the reader kept of one trace file (built by :mod:`ampdiag.trace.builder` only).

    The GPU, launch and host records are numpy columns (:meth:`columns`).

    Attributes:
        path: The file.
        rank: ``distributedInfo.rank``, else a rank in the file name, else the file's index.
        rank_source: Where the rank came from: "distributedInfo", "file name" or "position".
        world_size: ``distributedInfo.world_size`` where present.
        devices: Names of the GPUs in ``deviceProperties`` (empty for CPU-only traces).
        capabilities: Their compute capabilities, "major.minor" ("" where not recorded).
        steps: ``(N, start_us, end_us, pid)`` for each ``ProfilerStep#N``, sorted by start.
        cpu_ops: CPU op name -> [calls, inclusive_us], as torch's tools count them: an op that
            is the only child of a same-name op on its thread is part of that call, and data
            loading (``enumerate(DataLoader)``, ``enumerate(DataPipe)``) is not an op.
        cpu_self: CPU op name -> self us: each op's time less its direct child ops' (the
            innermost enclosing op on its thread is the parent), summed per name.
        memory: The ``[memory]`` allocator events (see ``MemoryEvent``), in file order.
        memory_columns: The same events as numpy columns: ``ts``, ``addr``, ``size``,
            ``device_type``, ``device_id``, ``allocated`` and ``reserved`` (the allocator's
            ``Total Allocated`` / ``Total Reserved``; -1: absent), and ``op``: the innermost CPU
            op of its thread running at its time (the op that allocated or freed; an index into
            ``columns().names``, -1: none).
        modules: Module (``Linear_0``, from ``nn.Module: Linear_0`` python_function spans of a
            ``with_modules``/``with_stack`` trace) -> [calls, inclusive host us].
        events: Number of trace events read.
        skipped: Reason -> number of events skipped for it.
        meta: Other top-level keys (small values only).
        reader: "fast" (every event decoded by msgspec, odd events repaired one run at a
            time) or "lenient" (the file read by the standard-library stream).
    """

    def __init__(self, path: Path, columns: Columns) -> None:
        self.path = path
        self.rank = 0
        self.rank_source = "position"
        self.world_size: int | None = None
        self.devices: list[str] = []
        self.capabilities: list[str] = []
        self.steps: list[tuple[int, float, float, Any]] = []
        self.cpu_ops: dict[str, list[float]] = {}
        self._cpu_self: dict[str, float] | None = None
        # set by the builder: the per-name-index self times, computed when called
        self._self_times: Callable[[], Any] | None = None
        self.memory_columns: dict[str, Any] = {}
        self._memory: list[MemoryEvent] | None = None
        self.modules: dict[str, list[float]] = {}
        self.events = 0
        self.skipped: dict[str, int] = {}
        self.meta: dict[str, Any] = {}
        self.reader = "fast"
        self._cols = columns

    @property
    def cpu_self(self) -> dict[str, float]:
        """Self us per CPU op name (see the class), computed on first read.

        Only a live CPU run's top-ops table reads it; ``ampdiag report TRACE`` never does, and
        the sweep is ~4% of that command's time.
        """
        if self._cpu_self is None:
            compute, self._self_times = self._self_times, None
            if compute is None:
                self._cpu_self = {}
            else:
                own = compute()
                names = self._cols.names
                self._cpu_self = {names[i]: float(own[i]) for i in own.nonzero()[0].tolist()}
        return self._cpu_self

    @property
    def memory(self) -> list[MemoryEvent]:
        """The ``[memory]`` events as tuples (see ``MemoryEvent``), made once from the columns."""
        if self._memory is None:
            m = self.memory_columns
            if not m or not len(m["ts"]):
                self._memory = []
            else:
                self._memory = list(
                    zip(
                        m["ts"].tolist(),
                        m["addr"].tolist(),
                        m["size"].tolist(),
                        m["device_type"].tolist(),
                        strict=True,
                    )
                )
        return self._memory

    def columns(self) -> Columns:
        """The GPU, launch and host records as numpy columns."""
        return self._cols

    @property
    def warnings(self) -> list[str]:
        """Human-readable lines about what was skipped."""
        return [f"{n} event(s) skipped: {why}" for why, n in sorted(self.skipped.items())]


def keep_meta(meta: dict[str, Any], key: str, val: Any) -> None:
    """Keeps what the analysis needs of a top-level key other than traceEvents."""
    if key in _META_KEYS:
        meta[key] = val
    elif key in ("schema", "nodes"):
        meta[key] = True


def apply_meta(out: RankTrace, index: int) -> None:
    """Rank, world size and devices from the top-level keys read."""
    dist = out.meta.get("distributedInfo")
    rank = dist.get("rank") if isinstance(dist, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 1 << 31:
        out.rank, out.rank_source = rank, "distributedInfo"
    else:
        m = _RANK_IN_NAME.search(out.path.name)
        if m:
            out.rank, out.rank_source = int(m.group(1)), "file name"
        else:
            out.rank, out.rank_source = index, "position"
    world = dist.get("world_size") if isinstance(dist, dict) else None
    if isinstance(world, int) and not isinstance(world, bool) and 0 < world < 1 << 31:
        out.world_size = world
    props = out.meta.get("deviceProperties")
    if isinstance(props, list):
        out.devices = [str(d.get("name", "?")) for d in props if isinstance(d, dict)]
        out.capabilities = [_capability(d) for d in props if isinstance(d, dict)]


def _capability(props: dict[str, Any]) -> str:
    """``computeMajor.computeMinor`` of one ``deviceProperties`` entry, "" if not integers."""
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    ok = all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in (major, minor)
    )
    return f"{major}.{minor}" if ok else ""
