"""Reading Kineto traces (torch.profiler's Chrome-trace JSON): the entry points.

The reader keeps only what the timeline analysis needs (:class:`~ampdiag.trace.records.RankTrace`):
GPU activities (kernels, memcpy, memset), the host-side launch calls (``cudaLaunchKernel`` and
friends, matched to the GPU by correlation id), ``ProfilerStep#N`` spans, the host events the
step breakdown classifies, per-name totals of CPU ops and the ``[memory]`` allocator events.
Nothing else is kept, so memory stays a small fraction of the JSON's size.

:func:`read_trace` decodes with msgspec (:mod:`ampdiag.trace.decode`), else with the
lenient standard-library stream (:mod:`ampdiag.trace.lenient`): the same records.

Variations accepted: float (nanosecond-precision) timestamps, missing ``distributedInfo`` or
rank (taken from the file name, else the file's position), legacy category names (``Kernel``,
``Memcpy``, ``Memset``, ``Runtime``, ``Operator``), CPU-only traces. Events with missing or
non-finite times or a negative duration are skipped and counted in ``skipped``. A file that is
not a Kineto trace, or not valid JSON, raises :class:`~ampdiag.errors.InputError`.
"""

from __future__ import annotations

from pathlib import Path

from ampdiag.trace.decode import read_fast
from ampdiag.trace.lenient import read_lenient
from ampdiag.trace.records import Fallback, RankTrace


def read_trace(path: str | Path, index: int = 0) -> RankTrace:
    """Reads one Kineto trace file.

    Args:
        path: A ``.json`` or ``.json.gz`` trace (gzip is detected from the content).
        index: The file's position among the ranks (the rank of last resort).

    Raises:
        InputError: Unreadable, not JSON, truncated, or not a Kineto trace.
    """
    p = Path(path)
    try:
        return read_fast(p, index)
    except Fallback:
        return read_lenient(p, index)
