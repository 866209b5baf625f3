"""The replay of the first non-finite step: what it measures, and that it changes nothing.

Truth is computed here without ampdiag: the same loop is run again and, at the first step
whose loss is non-finite, before its optimizer step, the test runs the model's forward itself
in FP32 and finds the first module whose output is non-finite and the largest |output|.
Whether the diagnosis then calls the cause right is proven on the scenario corpus
(tests/scenarios/sc_diverge_*).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ampdiag.sources.live.collectors.sentinel import Sentinel
from tests.collectors.helpers import module_callbacks


def fresh(norm: bool = True) -> nn.Module:
    """With BatchNorm (buffers) and Dropout (RNG); without: one that diverges in FP32."""
    torch.manual_seed(0)
    if not norm:
        return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                             nn.Linear(64, 4))  # fmt: skip
    return nn.Sequential(
        nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)
    )


def loop(
    model: nn.Module,
    dtype: torch.dtype | None,
    lr: float,
    at_nonfinite: Any = None,
    weights: list[bool] | None = None,
):
    """SGD at ``lr``; FP16 with a GradScaler. ``at_nonfinite(step, x)`` runs once, at the first
    step whose loss is non-finite, before the optimizer step; ``weights`` gets, per step,
    whether every weight is finite after its update. Returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
    g = torch.Generator().manual_seed(1)
    losses, seen = [], False
    for step in range(12):
        x = torch.randn(16, 8, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(x)
        loss = nn.functional.cross_entropy(out.float(), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if not math.isfinite(float(loss.detach())) and not seen and at_nonfinite is not None:
            seen = True
            at_nonfinite(step, x)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        losses.append(float(loss.detach()))
        if weights is not None:
            weights.append(all(bool(torch.isfinite(p).all()) for p in model.parameters()))
    return losses


def _same(a: list[float], b: list[float]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


def test_training_stays_bit_identical_and_nothing_is_left(
    quiet_diagnose: Callable[..., Any],
) -> None:
    plain, watched = fresh(), fresh()
    torch.manual_seed(5)
    want = loop(plain, torch.float16, lr=30.0)
    after_plain = torch.rand(1)  # the RNG after the run: the replay's dropout drew nothing
    assert not all(math.isfinite(v) for v in want), "the run must diverge"
    torch.manual_seed(5)
    with quiet_diagnose(watched, collectors=[Sentinel()]) as d:
        got = loop(watched, torch.float16, lr=30.0)
    assert torch.equal(torch.rand(1), after_plain)
    assert _same(want, got)
    for a, b in zip(plain.state_dict().values(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b) or (a.isnan().all() and b.isnan().all())  # buffers too
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None)
        assert a.grad is None or torch.equal(a.grad.nan_to_num(), b.grad.nan_to_num())
    assert all(module_callbacks(m) == 0 for m in watched.modules())
    assert all(not m._forward_hooks for m in watched.modules())
    assert d.session is not None
    replay = d.session.section("sentinel")["replay"]
    assert replay is not None and "fp32" in replay["results"] and "bf16" in replay["results"]


def test_the_fp32_replay_names_what_a_plain_fp32_forward_finds(
    quiet_diagnose: Callable[..., Any],
) -> None:
    truth: dict[str, Any] = {}

    def measure(step: int, x: torch.Tensor, model: nn.Module) -> None:
        names = {id(m): n for n, m in model.named_modules()}
        order: list[tuple[str, float]] = []
        hooks = [
            m.register_forward_hook(
                lambda m, i, o: order.append((names[id(m)], float(o.detach().abs().max())))
            )
            for m in model.modules()
            if m is not model
        ]
        state = torch.get_rng_state()
        buffers = [b.clone() for b in model.buffers()]
        with torch.no_grad():
            model(x)
        torch.set_rng_state(state)
        with torch.no_grad():
            for b, v in zip(model.buffers(), buffers, strict=True):
                b.copy_(v)
        for h in hooks:
            h.remove()
        bad = next((n for n, v in order if not math.isfinite(v)), None)
        finite = [(v, n) for n, v in order if math.isfinite(v)]
        truth.update(step=step, module=bad, max_abs=max(finite)[0] if finite else None)

    plain = fresh(norm=False)
    torch.manual_seed(5)
    finite_weights: list[bool] = []
    loop(plain, None, lr=30.0, at_nonfinite=lambda s, x: measure(s, x, plain),
         weights=finite_weights)  # fmt: skip
    watched = fresh(norm=False)
    torch.manual_seed(5)
    with quiet_diagnose(watched, collectors=[Sentinel()]) as d:
        loop(watched, None, lr=30.0)
    assert d.session is not None
    replay = d.session.section("sentinel")["replay"]
    assert replay is not None, truth
    fp32 = replay["results"]["fp32"]
    assert replay["step"] == truth["step"], (replay, truth)
    assert replay["run_precision"] == "fp32"
    assert fp32["finite"] is False
    assert fp32["origin"]["module"] == truth["module"] and fp32["origin"]["phase"] == "forward"
    assert math.isclose(fp32["max_abs"], truth["max_abs"], rel_tol=1e-6)
    assert replay["parameters_finite_after"] == finite_weights[truth["step"]]
