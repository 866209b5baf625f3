"""A root model's forwards seen through its class's ``__call__``, restored exactly.

Truth is counted by the test itself: the forwards it ran, the class attributes before and
after, torch's own global hook tables, and the weights of the same loop run without ampdiag.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from ampdiag.sources.live.collectors.sentinel import Sentinel

ORIGINAL_AUTOCAST_ENTER = torch.amp.autocast_mode.autocast.__enter__


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x)
        return out


class Derived(Base):
    """A subclass of another root's class (inherits its ``__call__``)."""


class OwnCall(Base):
    """A class with a ``__call__`` of its own (kept as the very same function)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)


def _train(models: list[nn.Module], steps: int, block: Any, during: Callable[[], None]) -> int:
    params = [p for m in models for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    forwards = 0
    with block:
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.zeros(())
            for m in models:
                loss = loss + m(torch.ones(2, 4)).pow(2).mean()
                forwards += 1
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            during()
    return forwards


def test_two_roots_of_related_classes_each_counted_once_and_classes_restored(
    quiet_diagnose: Callable[..., Any],
) -> None:
    torch.manual_seed(0)
    models: list[nn.Module] = [Base(), Derived(), OwnCall()]
    own_call = vars(OwnCall)["__call__"]
    plain = copy.deepcopy(models)
    _train(plain, 4, contextlib.nullcontext(), lambda: None)
    seen: list[tuple[int, int, bool]] = []

    def during() -> None:  # what the block installed, after each step
        seen.append(
            (
                len(nn_module._global_forward_pre_hooks),
                len(nn_module._global_forward_hooks),
                "__call__" in vars(Base),
            )
        )

    block = quiet_diagnose(collectors=[Sentinel()])
    forwards = _train(models, 4, block, during)
    session = block.session
    assert forwards == 12
    # each root forward counted once: Derived inherits Base's patched __call__
    assert session.sections["run"]["autocast_seen"] == {"none": 12}
    assert session.sections["sentinel"]["steps_watched"] == 4
    # no torch global module hook after the first step, the class patched meanwhile
    assert seen[0][2] and all(s == (0, 0, True) for s in seen[1:])
    # as found: no __call__ of their own, OwnCall's own the very same function
    assert "__call__" not in vars(Base) and "__call__" not in vars(Derived)
    assert vars(OwnCall)["__call__"] is own_call
    assert torch.amp.autocast_mode.autocast.__enter__ is ORIGINAL_AUTOCAST_ENTER
    # training unchanged
    for a, b in zip(plain, models, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q)


def test_a_root_forward_that_raises_leaves_the_next_ones_counted(
    quiet_diagnose: Callable[..., Any],
) -> None:
    model = Base()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    raised = 0
    with quiet_diagnose(collectors=[Sentinel()]) as d:
        for step in range(4):
            opt.zero_grad()
            if step == 2:
                try:
                    model(torch.ones(2, 3))  # wrong width: the forward raises
                except RuntimeError:
                    raised += 1
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
    assert raised == 1
    # the raising forward counted too (its state was read), and the ones after it
    assert d.session.sections["run"]["autocast_seen"] == {"none": 5}
    assert "__call__" not in vars(Base)


def test_copies_and_pickles_of_the_model_inside_the_block(
    quiet_diagnose: Callable[..., Any],
) -> None:
    # EMA-style deepcopy and torch.save of the model: nothing of ampdiag's travels with it
    model = Base()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_diagnose(collectors=[Sentinel()]) as d:
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            ema = copy.deepcopy(model)
            ema(torch.ones(2, 4))  # a copy's forward: not the root's
            buffer = io.BytesIO()
            torch.save(model, buffer)
    assert d.session.sections["run"]["autocast_seen"] == {"none": 3}
    assert vars(ema).keys() == vars(model).keys()
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded.fc.weight, model.fc.weight)


def test_on_root_calls_each_callback_once_per_forward_of_that_root() -> None:
    from ampdiag.sources.live import global_hooks

    base, derived, other = Base(), Derived(), Base()
    calls: list[tuple[str, str]] = []
    handles = [
        global_hooks.on_root(
            m,
            lambda mod, args, name=name: calls.append(("pre", name)),
            lambda mod, args, kwargs, out, name=name: calls.append(("post", name)),
        )
        for m, name in ((base, "base"), (derived, "derived"))
    ]
    try:
        base(torch.ones(1, 4))
        derived(torch.ones(1, 4))
        other(torch.ones(1, 4))  # an instance of the patched class that is no root
        with torch.no_grad():
            derived(torch.ones(1, 4))  # not a training forward
    finally:
        for h in handles:
            h.remove()
    assert calls == [("pre", "base"), ("post", "base"), ("pre", "derived"), ("post", "derived")]
    assert "__call__" not in vars(Base) and "__call__" not in vars(Derived)
