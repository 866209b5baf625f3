"""Whether another torch profiler is running, and where a profiler starts (torch 2.4 .. 2.13).

Kineto is one session per process: a second ``torch.profiler.profile`` started while one
records crashes the process (a segmentation fault in torch 2.13) or leaves the first one with
no events. So before ampdiag starts its profiler, and at each of its step boundaries, it asks:

* ``torch.autograd.profiler._is_profiler_enabled``: the process-wide flag torch sets while any
  Kineto-based profiler records (every thread's);
* ``torch.autograd._profiler_enabled()``: whether this thread records (legacy profilers too).

* a ``torch.profiler.profile`` in its schedule's warm-up (Kineto prepared, not yet recording:
  torch keeps no flag for that phase): only where one was ever made (torch's
  ``KinetoStepTracker._step_dict`` holds ``"ProfilerStep"``), the live
  ``torch.autograd.profiler.profile`` objects are looked up (``gc.get_referrers`` of the class:
  a walk of every Python object, so it is not done otherwise) for one entered and not yet exited
  (``entered`` set, ``kineto_results`` still None).

And a profiler that starts while ampdiag's is on is seen where every Kineto-based profiler
starts: ``torch.autograd.profiler.profile._prepare_trace`` and ``_start_trace``
(``torch.profiler.profile`` drives one).
"""

from __future__ import annotations

import gc
from typing import Any

import torch

PROFILER_STEP = "ProfilerStep"


def number_steps_from(prof: Any, first: int) -> None:
    """Numbers a ``torch.profiler.profile``'s steps from ``first`` (before it starts).

    Its ``ProfilerStep#N`` labels are ``step_num``, which ``step()`` increments and passes to
    the schedule (`profiler.make_schedule` shifts by the same ``first``): a window of a long
    run keeps its steps' run-wide numbers in the trace.
    """
    if first:
        prof.step_num = first


def running(ignore: Any = None) -> str | None:
    """Which other profiler is on now (recording, or warming up), or None.

    Args:
        ignore: ampdiag's own ``torch.profiler.profile`` (its warm-up is not another's).
    """
    try:
        from torch.autograd import profiler as autograd_profiler

        if getattr(autograd_profiler, "_is_profiler_enabled", False):
            return "a torch profiler is recording"
        enabled = getattr(torch.autograd, "_profiler_enabled", None)
        if enabled is not None and enabled():
            return "a torch profiler is recording in this thread"
        if _warming_up(autograd_profiler, inner_profile(ignore)):
            return "a torch profiler is warming up"
    except Exception:  # a changed torch: assume none rather than break the run
        return None
    return None


def _warming_up(autograd_profiler: Any, ignore: Any) -> bool:
    if not made_a_profiler():
        return False
    for obj in gc.get_referrers(autograd_profiler.profile):
        if (
            obj is not ignore
            and isinstance(obj, autograd_profiler.profile)
            and getattr(obj, "entered", False)
            and getattr(obj, "kineto_results", True) is None
        ):
            return True
    return False


def made_a_profiler() -> bool:
    """Whether a ``torch.profiler.profile`` was made and not exited (torch's step tracker).

    True when it cannot be told (another torch): then the slower look-up runs.
    """
    from torch.autograd import profiler as autograd_profiler

    steps = getattr(getattr(autograd_profiler, "KinetoStepTracker", None), "_step_dict", None)
    return not isinstance(steps, dict) or PROFILER_STEP in steps


def forget_profiler() -> None:
    """Removes ampdiag's own profiler from torch's step tracker.

    A ``torch.profiler.profile`` registers there when made and leaves only through ``with``'s
    exit; ampdiag's, started and stopped by hand, would stay registered and make every later
    `running` check take the slow path.
    """
    from torch.autograd import profiler as autograd_profiler

    tracker = getattr(autograd_profiler, "KinetoStepTracker", None)
    if tracker is not None:
        tracker.erase_step_count(PROFILER_STEP)


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
