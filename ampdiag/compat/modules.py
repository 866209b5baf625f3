"""A module tree without hooks, sharing the model's parameters and buffers.

ampdiag's FP32 replay runs the user's model a second time on a sampled step's inputs. Through
the model itself, every forward hook would fire again: the user's own (a hook of theirs seeing
a forward they never ran changes what they observe) and every other collector's (a forward
counted twice reads as gradient accumulation). `without_hooks` returns a shallow copy of each
module whose hook dictionaries (``_forward_hooks``, ``_forward_pre_hooks``, ``_backward_hooks``
and the rest: private ``nn.Module`` attributes, checked on torch 2.4 - 2.13) are empty, with
the same ``_parameters`` and ``_buffers`` dicts, so the copy computes with the very tensors
the model holds and writes its buffers (BatchNorm's running statistics) in place (the caller
restores them). A ``forward`` set on the instance (Accelerate wraps it in autocast) is a method
bound to the model's module: the copy's is rebound to the copy, so the call never reaches the
hooked original. Global module hooks still fire: callers run the copy inside
``internal_work()``, which ampdiag's own global hooks skip.
"""

from __future__ import annotations

import copy
import types
from collections import OrderedDict

import torch

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def without_hooks(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, dict[int, torch.nn.Module]]:
    """The hook-free copy of ``model``, and the model's module each of the copy's stands for.

    Returns:
        (copy, origin): ``origin[id(m)]`` is the model's module that the copy's module ``m``
        stands for. A module reached twice is copied once.
    """
    origin: dict[int, torch.nn.Module] = {}
    made: dict[int, torch.nn.Module] = {}

    def clone(m: torch.nn.Module) -> torch.nn.Module:
        if id(m) in made:
            return made[id(m)]
        c = copy.copy(m)
        for name in _HOOK_DICTS:
            if name in m.__dict__:
                c.__dict__[name] = OrderedDict()
        c.__dict__["_modules"] = OrderedDict()
        forward = m.__dict__.get("forward")
        if isinstance(forward, types.MethodType) and forward.__self__ is m:
            c.__dict__["forward"] = types.MethodType(forward.__func__, c)
        elif forward is not None:  # some other callable: it may reach the hooked original
            raise TypeError("the module's instance forward cannot be rebound to a copy")
        made[id(m)] = c
        origin[id(c)] = m
        for name, sub in m._modules.items():
            c.__dict__["_modules"][name] = clone(sub) if sub is not None else None
        return c

    return clone(model), origin


def uncompiled(model: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module ``torch.compile`` wraps, and whether ``model`` was compiled at all.

    ``torch.compile(model)`` returns an ``OptimizedModule`` whose original is ``_orig_mod``
    and whose ``forward`` is an instance attribute (the compiled call); ``model.compile()``
    compiles in place and keeps the compiled call in ``_compiled_call_impl``. A copy meant
    for extra eager forwards needs the original: see `eager_copy_fix`.
    """
    inner = model.__dict__.get("_modules", {}).get("_orig_mod")
    if isinstance(inner, torch.nn.Module) and "forward" in model.__dict__:
        return inner, True
    return model, model.__dict__.get("_compiled_call_impl") is not None


def eager_copy_fix(copied: torch.nn.Module) -> None:
    """Makes a deep copy of an in-place compiled module (``model.compile()``) run eagerly."""
    if copied.__dict__.get("_compiled_call_impl") is not None:
        copied.__dict__["_compiled_call_impl"] = None


def upcast_copy(replica: torch.nn.Module) -> None:
    """Gives the replica (`without_hooks`) FP32 copies of its FP16/BF16 parameters and buffers.

    Each replica module gets its own ``_parameters``/``_buffers`` dicts (the model's stay as
    they are); a tensor shared by two modules (a tied LM head) gets one copy, shared alike.
    """
    made: dict[int, torch.Tensor] = {}

    def up(t: torch.Tensor | None, param: bool) -> torch.Tensor | None:
        if t is None or t.dtype not in (torch.float16, torch.bfloat16):
            return t
        if id(t) not in made:
            with torch.no_grad():
                value = t.detach().float()
            made[id(t)] = torch.nn.Parameter(value, t.requires_grad) if param else value
        return made[id(t)]

    for m in replica.modules():
        m.__dict__["_parameters"] = {k: up(v, True) for k, v in m._parameters.items()}
        m.__dict__["_buffers"] = {k: up(v, False) for k, v in m._buffers.items()}


#: A module's state kept as plain attributes: (module, attribute, value, the tensors' versions).
State = list[tuple[torch.nn.Module, str, object, tuple[int, ...]]]


def state_attributes(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """The (module, attribute) pairs of ``model`` holding tensors as plain attributes.

    Outside its parameters and buffers: an RNN LM's detached hidden state kept between steps
    (TBPTT), a cache. The replay of a step starts from their values as the step began.
    """
    found = []
    for m in model.modules():
        for name, value in m.__dict__.items():
            if not name.startswith("_") and _tensors(value) is not None:
                found.append((m, name))
    return found


def keep_state(attributes: list[tuple[torch.nn.Module, str]]) -> State:
    """The attributes' values now, by reference, with their tensors' versions (no copy)."""
    kept: State = []
    for m, name in attributes:
        value = m.__dict__.get(name)
        tensors = _tensors(value)
        if tensors is not None:
            kept.append((m, name, value, tuple(t._version for t in tensors)))
    return kept


def changed_state(
    kept: State, names: dict[int, str]
) -> tuple[dict[int, dict[str, object]], list[str], dict[int, dict[str, object]]]:
    """What changed since `keep_state`: ``(rebound, written in place, every value then)``.

    ``rebound``/``every value then``: ``{id(module): {attribute: value then}}``. A value the
    module rebound (``self.h = h.detach()``) is restored from the reference kept; one written
    in place (``self.h.copy_(...)``) cannot be: its name (``names``: the modules' names) is in
    the list.
    """
    restore: dict[int, dict[str, object]] = {}
    every: dict[int, dict[str, object]] = {}
    in_place: list[str] = []
    for m, name, value, versions in kept:
        now = m.__dict__.get(name)
        tensors = _tensors(value) or []
        every.setdefault(id(m), {})[name] = value
        if now is not value:
            restore.setdefault(id(m), {})[name] = value
        if tuple(t._version for t in tensors) != versions:
            in_place.append(f"{names.get(id(m), type(m).__name__)}.{name}")
    return restore, in_place, every


def _tensors(value: object) -> list[torch.Tensor] | None:
    """The tensors of a tensor or a tuple/list of tensors (an LSTM's (h, c)), else None."""
    if isinstance(value, torch.Tensor):
        return [value]
    if (
        isinstance(value, (tuple, list))
        and value
        and all(isinstance(v, torch.Tensor) for v in value)
    ):
        return list(value)
    return None
