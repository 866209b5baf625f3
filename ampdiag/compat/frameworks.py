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

`calling_framework` also finds a library's trainer that builds the Accelerator itself
(denoising-diffusion-pytorch's ``Trainer(amp=..., mixed_precision_type=...)``): its user never
writes ``Accelerator(...)``, so the fix must name that trainer's own arguments.
"""

from __future__ import annotations

import gc
import inspect
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


_LIGHTNING = ("lightning.pytorch.", "pytorch_lightning.", "lightning.fabric.", "lightning_fabric.")


def _defined_in(obj: object, prefixes: tuple[str, ...], name: str | None = None) -> bool:
    """Whether a class in ``obj``'s MRO comes from one of these modules (and has this name)."""
    return any(
        str(getattr(cls, "__module__", "")).startswith(prefixes)
        and (name is None or cls.__name__ == name)
        for cls in type(obj).__mro__
    )


def _hf_precision(trainer: Any) -> str:
    args = getattr(trainer, "args", None)
    if getattr(args, "bf16", False) is True:
        return "bf16"
    return "fp16" if getattr(args, "fp16", False) is True else "no"


def _lightning_precision(trainer: Any) -> str | None:
    try:
        value = trainer.precision  # "bf16-mixed", "16-mixed", "32-true", ...
    except Exception:
        return None
    return str(value) if value is not None else None


#: A library trainer's ``__init__`` arguments that set its Accelerator's precision or
#: accumulation (an argument whose name has "accum" in it counts too).
_TRAINER_ARGS = ("amp", "fp16", "bf16", "mixed_precision", "mixed_precision_type")


def _installed(filename: str) -> bool:
    """Whether code comes from an installed library (never the user's own files)."""
    return "site-packages" in filename or "dist-packages" in filename


def _accelerate_owner(obj: Any) -> dict[str, Any] | None:
    """A library object holding an ``accelerate.Accelerator`` as ``self.accelerator``.

    ``{"name": "accelerate", "precision": its mixed precision, "via": "Trainer
    (denoising_diffusion_pytorch)", "via_args": the ``__init__`` arguments that set precision
    or accumulation}``; None for anything else.
    """
    accelerator = vars(obj).get("accelerator") if hasattr(obj, "__dict__") else None
    if accelerator is None or not _defined_in(accelerator, ("accelerate.",), "Accelerator"):
        return None
    cls = type(obj)
    try:
        names = list(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        names = []
    found: dict[str, Any] = {
        "name": "accelerate",
        "via": f"{cls.__name__} ({cls.__module__.split('.')[0]})",
        "via_args": [n for n in names if n in _TRAINER_ARGS or "accum" in n],
    }
    precision = accelerate_mixed_precision()
    if precision is not None:
        found["precision"] = precision
    return found


def calling_framework(max_depth: int = 80) -> dict[str, Any] | None:
    """The training framework whose loop called into the model: its name and precision.

    Read once from the call stack where the run finds its model or optimizer: a
    ``transformers.Trainer`` method's ``self`` ({"name": "hf-trainer", "precision": "bf16"
    from ``args.bf16``/``args.fp16``, else "fp16" or "no"}), or Lightning's Trainer, or a
    ``LightningModule`` bound to one ({"name": "lightning", "precision": ``trainer.precision``,
    e.g. "bf16-mixed"}), or an installed library's trainer that owns an Accelerator
    (`_accelerate_owner`). None when no framework is on the stack. Only frames of the
    frameworks' own modules, or of installed code that reads ``accelerator``, are read (their
    ``self``), never the user's. Never raises: a frame whose locals cannot be read is passed
    over.
    """
    try:
        frame = sys._getframe(1)
    except ValueError:
        return None
    depth = 0
    while frame is not None and depth < max_depth:
        depth += 1
        current, frame = frame, frame.f_back  # type: ignore[assignment]
        # Only the frameworks' own frames are read: reading a frame's locals snapshots all of
        # them into the frame (kept until it returns), which must not happen to the user's.
        module = str(current.f_globals.get("__name__", ""))
        code = current.f_code
        owner = (
            "accelerator" in code.co_names
            and not module.startswith(("accelerate.", "torch.", "transformers.", *_LIGHTNING))
            and _installed(code.co_filename)
        )
        if not owner and not module.startswith(("transformers.", *_LIGHTNING)):
            continue
        try:
            obj = current.f_locals.get("self")
        except Exception:
            obj = None
        if obj is None:
            continue
        try:
            if owner:
                found_owner = _accelerate_owner(obj)
                if found_owner is not None:
                    return found_owner
                continue
            if _defined_in(obj, ("transformers.",), "Trainer"):
                return {"name": "hf-trainer", "precision": _hf_precision(obj)}
            if _defined_in(obj, _LIGHTNING):
                trainer = obj if type(obj).__name__ == "Trainer" else None
                if trainer is None:
                    trainer = vars(obj).get("_trainer") if hasattr(obj, "__dict__") else None
                    trainer = trainer if trainer is not None else getattr(obj, "trainer", None)
                found: dict[str, Any] = {"name": "lightning"}
                precision = _lightning_precision(trainer) if trainer is not None else None
                if precision is not None:
                    found["precision"] = precision
                    return found
                if trainer is not None:
                    return found
        except Exception:  # a user's __getattr__ or property that raises
            continue
    return None
