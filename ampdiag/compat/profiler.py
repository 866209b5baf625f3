"""Whether another torch profiler is running, and where a profiler starts (torch 2.4 .. 2.13).

Kineto is one session per process: a second ``torch.profiler.profile`` started while one
records crashes the process (a segmentation fault in torch 2.13) or leaves the first one with
no events. So before ampdiag starts its profiler, and at each of its step boundaries, it asks:

* ``torch.autograd.profiler._is_profiler_enabled``: the process-wide flag torch sets while any
  Kineto-based profiler records (every thread's);
* ``torch.autograd._profiler_enabled()``: whether this thread records (legacy profilers too).

And a profiler that starts while ampdiag's is on is seen where every Kineto-based profiler
starts: ``torch.autograd.profiler.profile._prepare_trace`` and ``_start_trace``
(``torch.profiler.profile`` drives one). A profiler still in its schedule's warm-up when the
block begins cannot be seen (torch keeps no flag for that phase).
"""

from __future__ import annotations

from typing import Any

import torch


def running() -> str | None:
    """Which profiler is recording now (any thread's Kineto one, or this thread's), or None."""
    try:
        from torch.autograd import profiler as autograd_profiler

        if getattr(autograd_profiler, "_is_profiler_enabled", False):
            return "a torch profiler is recording"
        enabled = getattr(torch.autograd, "_profiler_enabled", None)
        if enabled is not None and enabled():
            return "a torch profiler is recording in this thread"
    except Exception:  # a changed torch: assume none rather than break the run
        return None
    return None


def start_points() -> list[tuple[Any, str]]:
    """The (class, method) pairs every Kineto-based profiler calls as it prepares and starts.

    Each is called with the ``torch.autograd.profiler.profile`` that starts as ``self``.
    Empty where this torch has no such methods (then a later profiler goes unnoticed).
    """
    try:
        from torch.autograd.profiler import profile
    except ImportError:
        return []
    return [
        (profile, name) for name in ("_prepare_trace", "_start_trace") if hasattr(profile, name)
    ]


def inner_profile(prof: Any) -> Any:
    """The ``torch.autograd.profiler.profile`` a ``torch.profiler.profile`` drives, if any yet."""
    return getattr(prof, "profiler", None)
