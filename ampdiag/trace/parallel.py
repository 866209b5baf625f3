"""Reading one large trace file with several processes at once (the fast path, forked).

Decoding JSON holds the interpreter's lock, so threads would not help; processes do. The
decompressed file is cut into parts by offset (:func:`ampdiag.trace.fastread.read_part` says
exactly where a part begins, so every event is read once). This process forks one worker per
part after the first, *before* it imports numpy, so the workers start at once; each worker
decompresses the file up to its part (cheap next to decoding), decodes the part into compact
columns (``array.array``, never numpy) and sends them back through a pipe, pickled. This process
reads the first part meanwhile, then appends the workers' columns in file order, renumbering
their names: the records are those of one reader of the whole file, in the same order.

A part that meets anything the fast path does not handle makes the whole file fall back to the
general reader, as the one-process fast path does. A worker that dies or fails otherwise makes
this process read the file alone. Used only where ``os.fork`` exists and the process is known
to run a single thread (Linux, from /proc: forking a threaded process can deadlock the child;
importing numpy starts threads, hence forking first), the machine has more than one core for
it, and the file is large enough (``MIN_PART_BYTES`` a part). ``AMPDIAG_TRACE_WORKERS`` sets
the number of processes (``1``: never fork), threads or not. The fork, the pipe protocol
(`send` / `receive`) and the worker's reading (`read_part_outcome`) serve
:mod:`ampdiag.trace.parallel_files` too.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ampdiag.trace.reader import Fallback, apply_meta

if TYPE_CHECKING:
    from ampdiag.trace.builder import ColumnBuilder
    from ampdiag.trace.reader import RankTrace

MIN_PART_BYTES = 16 << 20
"""Decompressed bytes per process below which a file is not split further."""
MAX_WORKERS = 8
HEAD_START_BYTES = 20 << 20
"""What a worker decodes while this process does its own extra work (importing numpy, merging):
this process's part is that much smaller (measured: about 0.12 s at about 170 MB/s)."""
SKIP_COST = 0.15
"""Cost of skipping a byte (decompressing it only) relative to decoding it (measured: ~0.15)."""
ENV_WORKERS = "AMPDIAG_TRACE_WORKERS"


def decompressed_size(path: Path) -> int:
    """The size of the file's JSON: gzip's ISIZE trailer (mod 2**32), else the file size."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(-4, os.SEEK_END)
        (isize,) = struct.unpack("<I", fh.read(4))
    # ISIZE wraps at 4 GiB, and a file of several gzip members gives the last one's: a guess
    # below the compressed size is surely wrong (only the split's balance depends on it).
    return int(isize) if isize >= size else size * 16


def _proc_sum(path: str, keys: tuple[str, ...]) -> int:
    """The sum of the numbers on the ``key: N [kB]`` lines of a /proc file."""
    total = 0
    with open(path, encoding="ascii") as fh:
        for line in fh:
            if line.startswith(keys):
                total += int(line.split()[1])
    return total


def own_peak_bytes() -> int:
    """This process's peak resident memory less what it still shares with others (Linux).

    For a forked worker: its peak without the pages of its parent it never wrote to, which its
    parent's own figure counts already. 0 where /proc does not tell.
    """
    try:
        peak = _proc_sum("/proc/self/status", ("VmHWM:",))
        shared = _proc_sum("/proc/self/smaps_rollup", ("Shared_Clean:", "Shared_Dirty:"))
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, peak - shared) * 1024


def _threads() -> int:
    """Threads of this process (Linux), 0 where unknown."""
    try:
        return _proc_sum("/proc/self/status", ("Threads:",))
    except (OSError, ValueError, IndexError):
        return 0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers_for(size: int) -> int:
    """How many processes read a file of ``size`` decompressed bytes (1: this one alone)."""
    if not hasattr(os, "fork"):
        return 1
    env = os.environ.get(ENV_WORKERS, "").strip()
    if env:  # asked for: even in a threaded process (the workers touch no other thread's state)
        try:
            return max(1, min(64, int(env)))
        except ValueError:
            return 1
    wanted = min(_cores(), MAX_WORKERS, size // MIN_PART_BYTES)
    return wanted if wanted > 1 and _threads() == 1 else 1


def split_points(size: int, parts: int) -> list[int]:
    """Offsets where parts 1.. begin, so that every process ends its part at about one time.

    In units of decoding one byte: this process spends ``HEAD_START_BYTES`` besides decoding
    its part ``[0, s1)``; worker k skips to ``s_k`` (``SKIP_COST`` a byte) and decodes
    ``[s_k, s_k+1)``. With a common finishing time T: ``s1 = T - HEAD_START_BYTES`` and
    ``s_k+1 = s_k (1 - SKIP_COST) + T``; T is found by bisection so that the last part ends at
    ``size``. (Bytes are not all equal work, Kineto writing its dense CPU events first; this
    balances well enough on real traces, see ``benchmarks/bench_trace.py``.)
    """

    def last_end(t: float) -> float:
        s = max(0.0, t - HEAD_START_BYTES)
        for _ in range(parts - 1):
            s = s * (1 - SKIP_COST) + t
        return s

    lo, hi = 0.0, float(size) + HEAD_START_BYTES
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if last_end(mid) < size else (lo, mid)
    points = [max(0.0, hi - HEAD_START_BYTES)]
    for _ in range(parts - 2):
        points.append(points[-1] * (1 - SKIP_COST) + hi)
    # at least one byte each, in order (a part that starts no event is simply empty)
    out: list[int] = []
    for p in points:
        out.append(min(size - 1, max(int(p), out[-1] + 1 if out else 1)))
    return out


class WorkerFailed(Exception):
    """A worker died or failed other than by meeting what the fast path does not handle."""


def send(pipe: IO[bytes], result: tuple[str, Any]) -> None:
    """Writes one outcome to a pipe: its length, the writer's own peak memory, the pickle."""
    payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<QQ", len(payload), own_peak_bytes()))
    pipe.write(payload)
    pipe.flush()


def receive(pipe: IO[bytes]) -> tuple[tuple[str, Any], int]:
    """Reads one outcome that `send` wrote: (it, the writer's own peak memory).

    Raises:
        WorkerFailed: The pipe ended early (the worker died) or held something else.
    """
    head = pipe.read(16)
    if len(head) < 16:
        raise WorkerFailed("the worker ended without an answer")
    size, peak = struct.unpack("<QQ", head)
    payload = pipe.read(size)
    if len(payload) < size:
        raise WorkerFailed("the worker's answer was cut short")
    try:
        result: tuple[str, Any] = pickle.loads(payload)
    except Exception as exc:
        raise WorkerFailed(repr(exc)) from None
    return result, int(peak)


def read_part_outcome(path: Path, lo: int = 0, hi: int | None = None) -> tuple[str, Any]:
    """In a worker: ("ok", (meta, columns state)) for a part, or ("fallback", why)."""
    from ampdiag.trace.fastread import read_part

    try:
        out, build = read_part(path, lo, hi)
    except Fallback as exc:
        return "fallback", str(exc)
    return "ok", (out.meta, build.state())


def _send_part(path: Path, lo: int, hi: int | None, pipe: IO[bytes]) -> None:
    send(pipe, read_part_outcome(path, lo, hi))


def fork_worker(job: Callable[[IO[bytes]], None]) -> tuple[int, int]:
    """Forks a worker that runs ``job(pipe)`` and exits; returns (its pid, the pipe's end)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the worker (which exits)
        code = 1
        try:
            os.close(r)
            with os.fdopen(w, "wb") as pipe:
                job(pipe)
            code = 0
        finally:
            os._exit(code)  # never return into the caller's stack, never run its exit handlers
    os.close(w)
    return pid, r


def stop(pid: int) -> None:
    """Kills and reaps a worker (nothing if it is gone)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


def _collect(pid: int, fd: int) -> tuple[tuple[str, Any], int]:
    """A worker's one outcome (reaps it; stops it if this is interrupted)."""
    status = None
    try:
        with os.fdopen(fd, "rb") as pipe:
            got = receive(pipe)
        _, status = os.waitpid(pid, 0)
    finally:
        if status is None:
            stop(pid)
    if status != 0:
        raise WorkerFailed(f"worker exited with status {status}")
    return got


def read_fast(path: Path, index: int = 0) -> RankTrace:
    """Reads one file with the fast path, in parts by several processes where that pays.

    The workers are forked before msgspec and numpy are imported here, so they start at once.

    Args:
        path: A ``.json`` or ``.json.gz`` Kineto trace.
        index: The file's position among the ranks (the rank of last resort).

    Returns:
        The RankTrace (its records as numpy columns), the same however many processes read it.

    Raises:
        Fallback: Anything the fast path does not handle; read the file with the general reader.
        ImportError: msgspec is not installed.
    """
    children: list[tuple[int, int]] = []
    try:
        starts = _fork(path, children)
        from ampdiag.trace import fastread

        got = _read_parts(path, starts, children) if children else None
        out, build = got or fastread.read_part(path)
    finally:
        for pid, fd in children:  # left running by an exception (Ctrl-C...): stop them
            os.close(fd)
            stop(pid)
    build.finish(out)
    apply_meta(out, index)
    out.reader = "fast"
    return out


def _fork(path: Path, children: list[tuple[int, int]]) -> list[int]:
    """Forks the workers where that pays, adding (pid, pipe) to ``children``; the part starts."""
    try:
        size = decompressed_size(path)
    except OSError:
        return []
    parts = workers_for(size)
    if parts < 2:
        return []
    starts = split_points(size, parts)
    ends: list[int | None] = [*starts[1:], None]
    for lo, hi in zip(starts, ends, strict=True):
        children.append(fork_worker(functools.partial(_send_part, path, lo, hi)))
    return starts


def _read_parts(
    path: Path, starts: list[int], children: list[tuple[int, int]]
) -> tuple[RankTrace, ColumnBuilder] | None:
    """Reads the first part here and gathers the workers' (emptying ``children``).

    Returns:
        What :func:`~ampdiag.trace.fastread.read_part` returns for the whole file; None when a
        worker failed (the caller reads the file alone).

    Raises:
        Fallback: A part met what the fast path does not handle.
    """
    from ampdiag.trace.fastread import read_part

    out, build = read_part(path, 0, starts[0])
    import numpy  # noqa: F401 - needed next; imported while the workers still decode

    results = []
    try:
        while children:
            results.append(_collect(*children.pop(0)))
    except WorkerFailed:
        return None
    for (status, value), _ in results:
        if status == "fallback":
            raise Fallback(value)
        if status != "ok":
            return None
    while results:  # in file order, each freed once absorbed (peak memory)
        (_, (meta, state)), worker_bytes = results.pop(0)
        build.absorb(state)
        del state
        out.meta.update(meta)
        out.worker_peak_bytes.append(worker_bytes)
    out.processes = len(starts) + 1
    return out, build
