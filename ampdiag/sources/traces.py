"""A Session from existing Kineto traces: one file, or a folder with one trace per rank.

The reading is `ampdiag.trace`'s; the timeline figures are `ampdiag.analysis.timeline`'s; this
module only puts what they return into a Session (and must not import torch).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ampdiag._layout import MEMORY_DIR, SESSION_FILE, TENSORBOARD_DIR
from ampdiag._version import __version__
from ampdiag.analysis.communication import across_ranks, rank_communication
from ampdiag.analysis.device import parse_capability, runs_bf16
from ampdiag.analysis.timeline import analyze_rank, header_facts, summarize_ranks
from ampdiag.errors import InputError
from ampdiag.session import Session
from ampdiag.trace.files import open_binary
from ampdiag.trace.reader import read_trace

if TYPE_CHECKING:
    from ampdiag.schema import Environment

_J = TypeVar("_J")
_R = TypeVar("_R")

TRACE_SUFFIXES = (".json", ".json.gz")
NOT_TRACE_DIRS = frozenset({TENSORBOARD_DIR, MEMORY_DIR})


def trace_files(path: Path) -> list[Path]:
    """The trace files at a path: the file itself, or the traces in a folder (sorted).

    Raises:
        InputError: No trace files, or a folder (or subfolder) that cannot be listed: a rank
            whose folder is unreadable is reported, not silently left out.
    """
    if path.is_file():
        return [path]

    def unlistable(err: OSError) -> None:
        raise InputError(f"cannot list {err.filename!r}: {err.strerror or err}")

    found = []
    for folder, dirs, files in os.walk(path, onerror=unlistable):
        # A folder of diagnose() outputs (rank-N/ sessions) holds other JSON: session files
        # and TensorBoard/memory folders are not traces.
        dirs[:] = [d for d in dirs if d not in NOT_TRACE_DIRS]
        found += [
            Path(folder, f) for f in files if f.endswith(TRACE_SUFFIXES) and f != SESSION_FILE
        ]
    found = sorted(p for p in found if p.is_file())
    if not found:
        raise InputError(f"no trace files (*.json, *.json.gz) in {str(path)!r}")
    return found


TRACE_MARKERS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"')
"""Keys one of which a Kineto trace has near its start (it opens with the top-level keys)."""
SNIFF_BYTES = 1 << 16


def split_foreign(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(traces, other files): a JSON file of a folder without a trace's keys near its start.

    A folder of traces may hold other JSON (``metrics.json``, a config): those are skipped
    rather than failing the whole folder. Only the first bytes are read (decompressed).
    """
    traces: list[Path] = []
    foreign: list[Path] = []
    for f in files:
        try:
            with open_binary(f) as fh:
                head = fh.read(SNIFF_BYTES)
        except (OSError, EOFError):
            head = b""
        (traces if any(m in head for m in TRACE_MARKERS) else foreign).append(f)
    return traces, foreign


def session_from_traces(path: Path, hta: bool = False, files: list[Path] | None = None) -> Session:
    """A Session analyzing existing trace file(s), with the sections a trace supports.

    Args:
        path: A trace file (.json / .json.gz) or a folder of them (one per rank).
        hta: Also run HTA's own analyses (critical path, queue length, launch statistics) where
            HTA is installed and they succeed; their results go under ``timeline.hta``.
        files: The trace files to read (default: `trace_files` of ``path``, where files that
            are not Kineto traces are skipped with a warning).

    Returns:
        A Session whose ``timeline`` section holds one entry per rank (``ranks``: ``idle_us``,
        ``compute_us``, ``non_compute_us`` and the rest, in HTA's definitions) and a ``summary``;
        its ``profiler`` section holds the host step breakdown of the first rank.

    Raises:
        InputError: No trace files, or a file that is unreadable or not a Kineto trace.
    """
    warnings: list[str] = []
    if files is None:
        files = trace_files(path)
        if path.is_dir():
            files, foreign = split_foreign(files)
            warnings += [f"{f.name}: skipped, not a Kineto trace" for f in foreign]
            if not files:
                raise InputError(f"no Kineto traces in {str(path)!r} (only other JSON files)")
    parts = pooled(analyze_trace, [(f, i) for i, f in enumerate(files)])
    return timeline_session(path, files, parts, warnings, hta)


def analyze_trace(job: tuple[Path, int]) -> dict[str, Any]:
    """One trace read and analysed, in whichever process: its timeline entry, devices, world.

    ``job`` is (file, its rank of last resort). The entry is `analyze_rank`'s, with the trace's
    ``collectives`` (`rank_communication`): all the cross-rank figures need of a rank, so the
    trace itself is read once and dropped.
    """
    file, index = job
    # the [memory] allocator events: the trace's memory view (curve, peak, allocating ops)
    rt = read_trace(file, index)
    rank = analyze_rank(rt)
    rank["collectives"] = rank_communication(rt)
    return {
        "rank": rank,
        "devices": rt.devices,
        "capabilities": rt.capabilities,
        "world_size": rt.world_size,
    }


POOL_MIN_JOBS = 16
"""Fewer jobs than this run in this process: a pool's start costs more than it saves."""


def pool_size() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pooled(fn: Callable[[_J], _R], jobs: list[_J]) -> list[_R]:
    """``[fn(j) for j in jobs]``, over a process pool sized to the cores when there are many.

    Each job is one rank's file(s), independent of the others; results come back in order and
    the first job's error is raised, as in a loop. Forked workers where nothing forbids it
    (torch is not imported: it may hold threads), else spawned ones.
    """
    workers = min(pool_size(), len(jobs) // POOL_MIN_JOBS)
    if workers <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp  # here: its import costs one trace's report ~5 ms
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in mp.get_all_start_methods() and "torch" not in sys.modules else None
    with ProcessPoolExecutor(workers, mp_context=mp.get_context(method)) as pool:
        return list(pool.map(fn, jobs, chunksize=max(1, len(jobs) // (workers * 8))))


def timeline_session(
    path: Path, files: list[Path], parts: list[dict[str, Any]], warnings: list[str], hta: bool
) -> Session:
    """The Session of the analysed traces (`analyze_trace` of ``files``, in their order)."""
    ranks = []
    devices: list[str] = []
    capabilities: list[str] = []
    world: int | None = None
    seen: dict[int, Path] = {}
    for index, (file, part) in enumerate(zip(files, parts, strict=True)):
        rank = part["rank"]
        devices = devices or part["devices"]
        world = world or part["world_size"]
        if rank["rank"] in seen:
            # different jobs' traces side by side, or two runs of one job: kept apart by position
            warnings.append(
                f"{file.name}: rank {rank['rank']} appears twice (also {seen[rank['rank']].name}: "
                f"two runs in one folder?); using {index}"
            )
            rank["rank"], rank["rank_source"] = index, "position"
            own = part["devices"]
            rank["device"] = own[index % len(own)] if own else None
        seen[rank["rank"]] = file
        capabilities = capabilities or part.get("capabilities") or []
        ranks.append(rank)
    ranks.sort(key=lambda r: r["rank"])
    for r in ranks:
        warnings.extend(f"rank {r['rank']}: {w}" for w in r["warnings"])
        if not r["has_gpu"]:
            warnings.append(f"rank {r['rank']}: no GPU kernels in the trace (CPU side only)")
    first = ranks[0]
    communication = across_ranks(ranks)
    summary = summarize_ranks(ranks)
    if "straggler" in communication:  # the rank the others wait for, not the busiest one
        summary["slowest_rank"] = communication["straggler"]["rank"]
    timeline: dict[str, Any] = {
        "source": "trace",
        "trace_files": [str(f) for f in files],
        "ranks": ranks,
        "summary": summary,
        "communication": communication,
        "warnings": warnings,
    }
    if hta:
        from ampdiag.trace.hta_extra import run_hta  # HTA's own analyses, only when asked

        timeline["hta"] = run_hta(path, files)
    has_gpu = any(r["has_gpu"] for r in ranks)
    env: Environment = {
        "source": "trace",
        "device_type": "cuda" if has_gpu or devices else "cpu",
        "device_name": devices[0]
        if devices
        else ("GPU (unnamed in the trace)" if has_gpu else "cpu"),
        "rank": first["rank"],
        "world_size": world or len(ranks),
        "ranks_in_trace": len(ranks),
    }
    facts = header_facts(first)
    env["profiled_steps"] = facts["profiled_steps"]
    env["kernel_precisions"] = facts["kernel_precisions"]
    if capabilities and parse_capability(capabilities[0]):
        # what advice may say on this GPU (analysis/device.py): no BF16/TF32 below 8.0
        env["device_capability"] = capabilities[0]
        env["bf16_supported"] = bool(runs_bf16(env))
    sections: dict[str, Any] = {"timeline": timeline}
    if first["host"].get("steps"):
        # the host step breakdown, where the trace has ProfilerStep spans (the time section)
        sections["profiler"] = {
            "trace_files": [str(f) for f in files],
            "breakdown": first["host"],
            "top_ops": [],
        }
    return Session(
        environment=env,
        sections=sections,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ampdiag_version=__version__,
        path=None,
    )
