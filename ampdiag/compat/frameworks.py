"""Frameworks' private state ampdiag reads (checked on accelerate 1.15).

`accelerate_mixed_precision` reads ``AcceleratorState._shared_state["_mixed_precision"]``:
the mixed precision an ``Accelerator`` was created with, without calling ``AcceleratorState()``
(which would initialise the process-wide state when the user's code has not). Only when the
user's code imported Accelerate; None otherwise, or when the private state moved.
"""

from __future__ import annotations

import sys


def accelerate_mixed_precision() -> str | None:
    """The ``mixed_precision`` of the user's Accelerator ("fp16", "bf16", "no"), if any."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "AcceleratorState", None), "_shared_state", None)
    if not isinstance(shared, dict):
        return None
    mode = shared.get("_mixed_precision")
    return mode if isinstance(mode, str) else None
