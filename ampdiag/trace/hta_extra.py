"""HTA's own analyses of a trace (``ampdiag report TRACE --hta``), where HTA runs and succeeds.

Runs Holistic Trace Analysis (``pip install ampdiag[hta]``) on the same files: its temporal
breakdown (for comparison with ours), CUDA kernel launch statistics, queue length summary and
the critical path of one ``ProfilerStep``. Each analysis that fails is recorded with its error
instead of failing the report; results are reduced to small JSON tables.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_ROWS = 20


def _rows(df: Any, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
    """A DataFrame (or Series) as a list of JSON-safe dicts."""
    if df is None:
        return []
    if hasattr(df, "to_frame") and not hasattr(df, "columns"):
        df = df.to_frame()
    out = []
    for rec in df.head(limit).reset_index().to_dict(orient="records"):
        row: dict[str, Any] = {}
        for k, v in rec.items():
            if hasattr(v, "item"):
                v = v.item()
            row[str(k)] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
        out.append(row)
    return out


def _attempt(name: str, func: Callable[[], Any], out: dict[str, Any]) -> None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            result = func()
        out[name] = {"ok": True, "rows": result}
    except Exception as exc:  # HTA raises anything from pandas internals on odd traces
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


def run_hta(path: Path, files: list[Path]) -> dict[str, Any]:
    """The HTA analyses that succeed on the trace files (see module doc).

    Args:
        path: What the user passed (a file or a folder).
        files: The trace files found there.

    Returns:
        Analysis name -> {"ok": True, "rows": [...]} or {"ok": False, "error": "..."}.
    """
    out: dict[str, Any] = {}
    try:
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:
        return {
            "load": {
                "ok": False,
                "error": f"HTA is not installed ({exc}): pip install ampdiag[hta]",
            }
        }
    logging.getLogger("hta").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="ampdiag-hta-") as tmp:
        # HTA reads a folder; link the files into one so a single file or a nested folder works.
        for i, f in enumerate(files):
            suffix = ".json.gz" if f.name.endswith(".gz") else ".json"
            os.symlink(f.resolve(), Path(tmp) / f"trace_{i}{suffix}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    ta = TraceAnalysis(trace_dir=tmp)
            except Exception as exc:
                return {"load": {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}}
            ranks = sorted(ta.t.traces)
            _attempt(
                "temporal_breakdown",
                lambda: _rows(ta.get_temporal_breakdown(visualize=False)),
                out,
            )
            _attempt(
                "cuda_kernel_launch_stats",
                lambda: [
                    {"rank": r, **row}
                    for r, df in ta.get_cuda_kernel_launch_stats(
                        ranks=ranks[:1], visualize=False
                    ).items()
                    for row in _rows(df.describe())
                ],
                out,
            )
            _attempt(
                "queue_length_summary",
                lambda: _rows(ta.get_queue_length_summary(ranks=ranks[:1])),
                out,
            )

            def critical_path() -> list[dict[str, Any]]:
                iterations = ta.t.get_iterations(ranks[0])
                if not iterations:
                    raise ValueError("no ProfilerStep annotation to limit the analysis to")
                inst = iterations[1] if len(iterations) > 1 else iterations[0]
                graph, ok = ta.critical_path_analysis(
                    rank=int(ranks[0]), annotation="ProfilerStep", instance_id=int(inst)
                )
                if not ok:
                    raise ValueError("HTA's critical path algorithm did not succeed")
                return _rows(graph.summary())

            _attempt("critical_path", critical_path, out)
    return out
