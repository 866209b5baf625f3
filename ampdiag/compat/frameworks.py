"""Frameworks' private state ampdiag reads (checked on accelerate 1.15).

`accelerate_mixed_precision` reads ``AcceleratorState._shared_state["_mixed_precision"]``:
the mixed precision an ``Accelerator`` was created with, without calling ``AcceleratorState()``
(which would initialise the process-wide state when the user's code has not). Only when the
user's code imported Accelerate; None otherwise, or when the private state moved.

That state is process-wide and outlives the Accelerator (a notebook, a test suite): it says
what *some* Accelerator asked for, not that the run at hand is Accelerate's.
`accelerate_prepared` ties it to the run: the marks ``Accelerator.prepare`` leaves on what it
prepared (``_is_accelerate_prepared`` on the returned model and optimizer,
``_original_forward`` on a model whose forward it wrapped in autocast) and its
``AcceleratedOptimizer`` wrapper, whose ``optimizer`` is the optimizer torch's hooks see.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from typing import Any


def accelerate_mixed_precision() -> str | None:
    """The ``mixed_precision`` of the user's Accelerator ("fp16", "bf16", "no"), if any."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "AcceleratorState", None), "_shared_state", None)
    if not isinstance(shared, dict):
        return None
    mode = shared.get("_mixed_precision")
    return mode if isinstance(mode, str) else None


def _marked(obj: object) -> bool:
    try:
        return getattr(obj, "_is_accelerate_prepared", False) is True
    except Exception:  # a user's __getattr__ that raises something else
        return False


def accelerate_prepared(models: Sequence[Any], optimizers: Sequence[Any]) -> bool:
    """Whether ``Accelerator.prepare`` prepared one of these models or optimizers.

    A model counts when prepare() marked it or wrapped its forward (``prepare_model`` alone
    does only the latter, and only where it enters autocast). An optimizer counts when it is
    an ``AcceleratedOptimizer``, or the optimizer one wraps: torch's optimizer hooks fire on
    the wrapped one (the wrapper does not patch its own ``step``), so that is the one a run
    finds. Finding the wrapper means one pass over the objects the garbage collector tracks;
    it runs only when no model or optimizer carries a mark, and only when Accelerate was
    imported.
    """
    module = sys.modules.get("accelerate.optimizer")
    wrapper = getattr(module, "AcceleratedOptimizer", None)
    if any(_marked(m) or "_original_forward" in getattr(m, "__dict__", {}) for m in models):
        return True
    if any(_marked(o) for o in optimizers):
        return True
    if not isinstance(wrapper, type) or not optimizers:
        return False
    if any(isinstance(o, wrapper) for o in optimizers):
        return True
    wanted = {id(o) for o in optimizers}
    # type(), not isinstance(): isinstance reads ``__class__``, which some objects compute
    # (a deprecated torch alias warns when touched).
    return any(
        issubclass(type(obj), wrapper) and id(vars(obj).get("optimizer")) in wanted
        for obj in gc.get_objects()
    )
