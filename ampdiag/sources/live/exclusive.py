"""Process-wide resources that only one diagnose() block may hold at a time.

torch.profiler (one Kineto session per process: two at once crash it), the precision audit's
dispatch mode (a per-thread stack that must be popped in the order it was pushed) and CUDA's
memory history (one global recorder) cannot be shared. A block claims one before it uses it;
a block that cannot claim it runs without that part and says so in its session.
"""

from __future__ import annotations

import threading

PROFILER = "torch.profiler"
DISPATCH_MODE = "the precision audit's dispatch mode"
CUDA_HISTORY = "CUDA memory history"

_LOCK = threading.Lock()
_HOLDERS: dict[str, object] = {}


def claim(resource: str, owner: object) -> bool:
    """Takes ``resource`` for ``owner``; False when another owner holds it."""
    with _LOCK:
        holder = _HOLDERS.get(resource)
        if holder is None or holder is owner:
            _HOLDERS[resource] = owner
            return True
        return False


def release(resource: str, owner: object) -> None:
    """Gives ``resource`` back, if ``owner`` holds it (safe to call twice)."""
    with _LOCK:
        if _HOLDERS.get(resource) is owner:
            del _HOLDERS[resource]
