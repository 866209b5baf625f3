"""Reading several trace files at once: a folder of ranks, one worker process per core.

Worker k of W reads files k, k + W, k + 2W... whole, with the fast path, and sends each file's
columns back in that order through its pipe (:func:`ampdiag.trace.parallel.send`), so this
process takes them in file order as they come: it finishes and hands over one rank while the
workers read the next ones, and a worker is never more than one file ahead of it (it waits
in its write). The workers are forked before numpy is imported (as for one large file, see
:mod:`ampdiag.trace.parallel`, whose rules on cores, threads and ``AMPDIAG_TRACE_WORKERS``
apply). A file the fast path does not handle is read here by the general reader, which gives
the one clear error for bad input; a worker that dies leaves its remaining files to this
process. The records are those of reading the files one by one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ampdiag.trace import parallel
from ampdiag.trace.reader import apply_meta

if TYPE_CHECKING:
    from ampdiag.trace.reader import RankTrace


def workers_for(paths: list[Path]) -> int:
    """How many worker processes read ``paths`` (1: this process reads them one by one)."""
    if len(paths) < 2:
        return 1
    try:
        total = sum(parallel.decompressed_size(p) for p in paths)
    except OSError:
        return 1
    return min(len(paths), parallel.workers_for(total))


def read_files(paths: list[Path]) -> Iterator[RankTrace] | None:
    """The RankTraces of ``paths`` in order, read by worker processes.

    Returns:
        An iterator of them; None where workers do not pay (:func:`workers_for`): read the
        files one by one then.

    Raises (while iterating):
        InputError: A file is unreadable or not a Kineto trace (the general reader's error).
    """
    workers = workers_for(paths)
    return _read(paths, workers) if workers > 1 else None


def _send_files(paths: list[Path], mine: list[int], pipe: IO[bytes]) -> None:
    for i in mine:
        parallel.send(pipe, parallel.read_part_outcome(paths[i]))


def _read(paths: list[Path], workers: int) -> Iterator[RankTrace]:
    children = [
        parallel.fork_worker(
            functools.partial(_send_files, paths, list(range(k, len(paths), workers)))
        )
        for k in range(workers)
    ]
    pipes = [os.fdopen(fd, "rb") for _, fd in children]
    dead: set[int] = set()
    try:
        for index, path in enumerate(paths):
            k = index % workers
            got = None
            if k not in dead:
                try:
                    got = parallel.receive(pipes[k])
                except parallel.WorkerFailed:
                    dead.add(k)  # its files from here on are read here
            yield _rank(path, index, got)
    finally:
        for pipe in pipes:
            pipe.close()
        for pid, _ in children:
            parallel.stop(pid)  # done by now, or stopped early (an error, Ctrl-C): reaped


def _rank(path: Path, index: int, got: tuple[tuple[str, Any], int] | None) -> RankTrace:
    from ampdiag.trace.reader import read_trace, read_trace_stdlib

    if got is None:  # its worker died
        return read_trace(path, index)
    (status, value), peak = got
    if status != "ok":  # the fast path does not handle this file
        return read_trace_stdlib(path, index)
    from ampdiag.trace.builder import ColumnBuilder
    from ampdiag.trace.reader import RankTrace

    meta, state = value
    out = RankTrace(path=path, meta=meta)
    build = ColumnBuilder(None)
    build.absorb(state)
    build.finish(out)
    apply_meta(out, index)
    out.reader = "fast"
    out.worker_peak_bytes.append(peak)
    return out
