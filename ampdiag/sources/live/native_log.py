"""Keeps torch's native log lines (Kineto, the CPU allocator) out of the user's console.

Kineto prints ``USDT: ... profiler_start`` / ``profiler_stop`` straight to file descriptor 2
whatever its log level, and with ``profile_memory=True`` the CPU allocator logs "Memory block
of unknown size was allocated before the profiling started" (c10 ``LOG(WARNING)``, once per
1000 such frees, level fixed when torch was imported). Neither goes through Python, so
neither ``warnings`` nor ``sys.stderr`` can hold them back: while the profiler starts, steps
and stops, fd 2 is pointed at a temporary file, and afterwards every captured line that is
not one of those is written back to the real stderr (another thread's output is delayed, not
lost). The allocator's warning comes on the first free of a block allocated before profiling;
`prime_allocator_warning` makes that free happen inside the captured window, so its counter
starts there. The captured lines are kept for the session.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

#: Substrings of the native lines held back (kept in the session instead).
NOISE = ("SyncActivityProfilerHandler", "CPUAllocator.cpp", "USDT:", "STAGE:")
#: Most captured lines kept.
MAX_LINES = 20


@contextlib.contextmanager
def captured(into: list[str]) -> Iterator[None]:
    """Holds back Kineto's and the allocator's lines written to fd 2 while the block runs."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 (embedded interpreter, closed)
        yield
        return
    try:
        tmp = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by the `with tmp` below
    except OSError:
        os.close(saved)
        yield
        return
    with tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            keep = []
            for line in text.splitlines(keepends=True):
                if any(n in line for n in NOISE):
                    if len(into) < MAX_LINES:
                        into.append(line.rstrip())
                else:
                    keep.append(line)
            if keep:
                with contextlib.suppress(OSError):
                    os.write(2, "".join(keep).encode("utf-8", errors="replace"))


def prime_allocator_warning() -> object:
    """A one-element CPU tensor allocated now; free it inside `captured` (see the module doc)."""
    import torch

    return torch.empty(1)
