"""The divergence sentinel: exact first inf/NaN, nothing changed, nothing left behind.

Where the NaN comes from is proven on the scenario corpus (tests/scenarios/sc_nan_*); here
the mechanics: the finiteness token, the hooks' lifetime, and bit-identical training.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.sources.live.collectors.sentinel import Sentinel, finite_token
from tests.conftest import QUIET, train


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_token_is_finite_exactly_when_every_value_is(dtype: torch.dtype) -> None:
    big = torch.full((4096,), 60000.0 if dtype == torch.float16 else 1e30, dtype=dtype)
    assert torch.isfinite(finite_token(big))  # a sum beyond the dtype's range is no alarm
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.ones(1000, dtype=dtype)
        t[617] = bad
        assert not torch.isfinite(finite_token(t))
    mixed = torch.ones(10, dtype=dtype)
    mixed[1], mixed[2] = float("inf"), -float("inf")
    assert not torch.isfinite(finite_token(mixed))


def test_training_is_bit_identical_and_every_hook_is_removed(
    quiet_diagnose: Callable[..., Any],
) -> None:
    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def loop(model: nn.Module) -> None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            x = torch.randn(5, 8, generator=g)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x)
            out.float().square().mean().backward()
            opt.step()

    plain, watched = fresh(), fresh()
    loop(plain)
    with quiet_diagnose(watched, collectors=[Sentinel()]) as d:
        loop(watched)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(not m._forward_hooks for m in watched.modules())
    assert d.session is not None
    sec = d.session.section("sentinel")
    assert sec["steps_watched"] == 4 and sec["nonfinite_steps"] == []
    assert sec["forward_origin"] is None and sec["backward_origin"] is None


def test_all_zero_gradients_are_recorded_per_step(quiet_diagnose: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_diagnose(model, opt, collectors=[Sentinel()]) as d:
        for step in range(3):
            opt.zero_grad()
            loss = model(torch.randn(3, 4)).sum() * (0.0 if step == 1 else 1.0)
            loss.backward()
            opt.step()
    assert d.session is not None
    assert d.session.section("sentinel")["zero_grad_steps"] == [1]


def test_a_disabled_scalers_loss_is_read_once_per_step_and_each_step_its_own(
    quiet_diagnose: Callable[..., Any],
) -> None:
    # A CPU GradScaler disabled: scale() returns the loss itself, then passed to backward.
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    seen = []
    with quiet_diagnose(model, opt, scaler, collectors=[Sentinel()]) as d:
        for step in range(4):
            opt.zero_grad()
            loss = model(torch.randn(3, 4)).square().mean() + (math.nan if step == 2 else 0.0)
            seen.append(loss.item())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert d.session is not None
    sec = d.session.section("sentinel")
    assert sec["loss_nonfinite_steps"] == [2]
    assert sec["loss_history"] == [[0, seen[0]], [1, seen[1]]]  # finite, up to the first NaN


def test_the_loss_history_is_the_unscaled_loss_under_an_enabled_scaler(
    quiet_diagnose: Callable[..., Any],
) -> None:
    # An enabled GradScaler (CPU, FP32): each step gives the loss to scale() and the scaled
    # loss (x 1024) to backward; the history is the loss itself, read here with .item().
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    seen = []
    with quiet_diagnose(model, opt, scaler, collectors=[Sentinel()]) as d:
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(3, 4)).square().mean()
            seen.append(loss.item())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert d.session is not None
    history = d.session.section("sentinel")["loss_history"]
    assert [s for s, _ in history] == [0, 1, 2]
    assert [v for _, v in history] == pytest.approx(seen, rel=1e-6)


@pytest.mark.slow
def test_a_default_run_watches_every_step_profiled_ones_included(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(steps=6, dtype=torch.bfloat16, wrap=lambda: ampdiag.diagnose(out=out, **QUIET))
    s = ampdiag.load(out)
    assert s.section("sentinel")["steps_watched"] == 6
    assert any(st["profiled"] for st in s.steps)


class _InPlace(nn.Module):
    """Two children; at step ``at`` the parent's own code turns the first one's output inf in
    place (``h.mul_``: same tensor, new values) before handing it to the second."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.at, self.now = at, -1
        self.made: list[tuple[bool, bool]] = []  # (finite before, finite after) the mul_

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.now == self.at:
            before = bool(torch.isfinite(h).all())
            h.mul_(float("inf"))
            self.made.append((before, bool(torch.isfinite(h).all())))
        return self.b(h)


def test_a_value_changed_in_place_by_the_parent_is_the_parents(
    quiet_diagnose: Callable[..., Any],
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _InPlace(at=2))
    inner = model[1]
    assert isinstance(inner, _InPlace)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_diagnose(model, opt, collectors=[Sentinel()]) as d:
        for step in range(4):
            inner.now = step
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    # the parent's own code made the inf: finite output of child a, inf where child b began
    # (at step 2 only; the divergence replay runs that step's forward again)
    assert set(inner.made) == {(True, False)}
    assert d.session is not None
    origin = d.session.section("sentinel")["forward_origin"]
    assert origin is not None
    assert (origin["step"], origin["module"], origin["parent_code"]) == (2, "1", True)
    assert origin["between"] == ["1.a", "1.b"]


def test_no_activation_is_kept_alive_by_the_sentinel(quiet_diagnose: Callable[..., Any]) -> None:
    import weakref

    seen: list[weakref.ref[torch.Tensor]] = []

    class Keep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)  # a module output that nothing saves for the backward (add)
            seen.append(weakref.ref(h))
            return h + 1.0

    model = Keep()
    with quiet_diagnose(model, collectors=[Sentinel()]):
        out = model(torch.randn(3, 4))
        assert seen[0]() is None  # freed as soon as the user's code dropped it
        out.sum().backward()


class _NaNBackward(torch.autograd.Function):
    """Identity; its backward turns the gradient NaN when ``owner.now == owner.at`` and
    records (received finite, returned finite)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, owner: _Between) -> torch.Tensor:
        ctx.owner = owner
        return h.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        owner = ctx.owner
        if owner.now != owner.at:
            return grad, None
        out = grad * float("nan")
        owner.made.append((bool(torch.isfinite(grad).all()), bool(torch.isfinite(out).all())))
        return out, None


class _Between(nn.Module):
    """``b(op(a(x)))``: the op between two children makes NaN in the backward at step ``at``."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.at, self.now = at, -1
        self.made: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(_NaNBackward.apply(self.a(x), self))  # type: ignore[no-untyped-call]


def test_a_backward_op_between_two_children_is_the_parents(
    quiet_diagnose: Callable[..., Any],
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _Between(at=1))
    inner = model[1]
    assert isinstance(inner, _Between)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with quiet_diagnose(model, opt, collectors=[Sentinel()]) as d:
        for step in range(3):
            inner.now = step
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    # finite gradient in, NaN out, at step 1 (the divergence replay runs it once more)
    assert set(inner.made) == {(True, False)}
    assert d.session is not None
    origin = d.session.section("sentinel")["backward_origin"]
    assert origin is not None
    assert (origin["step"], origin["module"], origin["parent_code"]) == (1, "1", True)
    assert origin["between"] == ["1.a", "1.b"]


class _NaNOnThirdCall(nn.Module):
    """NaN on its third forward only: the live step's state, which no replay carries."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * float("nan") if self.calls == 3 else x


def test_a_replay_that_stays_finite_is_stated_not_passed_off_as_an_origin(
    quiet_diagnose: Callable[..., Any],
) -> None:
    torch.manual_seed(0)
    nan = _NaNOnThirdCall()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nan, nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with quiet_diagnose(collectors=[Sentinel()]) as d:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    assert nan.calls >= 5  # the live module ran every step (the replay ran a copy of it)
    assert d.session is not None
    found = next(f for f in d.session.all_findings() if f.id == "nonfinite-origin")
    assert found.evidence["step"] == 2  # the third call: step 2
    assert found.evidence.get("reproduced") is False, found.evidence
    assert "replay stayed finite" in found.title, found.title
    assert found.evidence["module"] != "2"  # it claims no module it did not see make it
