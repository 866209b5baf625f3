"""The per-step FP32 replay observes and never changes, and sees no one's hooks.

It runs the model a second time on every sampled step of an FP16 run (before the optimizer
step). Truth, counted here: the user's own forward hook fires once per step as without
ampdiag; the forwards per optimizer step stay 1 (no micro-batch invented); the parameters and
BatchNorm statistics after training are bit-identical with and without diagnose(); and the
replay ran on every sampled step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

import ampdiag
from ampdiag.compat.modules import without_hooks

QUIET = {"report": False, "tensorboard": False, "console": False, "profile": False}
STEPS = 4


def model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4)
    )


def train(m: nn.Module, calls: list[int]) -> None:
    m.register_forward_hook(lambda mod, args, out: calls.append(1))
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(STEPS):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(x)
        (((out.float() - y) ** 2).mean() * 1e-5).backward()  # small: FP16 underflows
        opt.step()


def run(out: Path | None) -> tuple[list[torch.Tensor], int, Any]:
    torch.manual_seed(0)
    m = model()
    calls: list[int] = []
    d = None
    if out is None:
        train(m, calls)
    else:
        with ampdiag.diagnose(out=out, sample_every=1, speed_probe=False, **QUIET) as d:
            train(m, calls)
    state = [t.detach().clone() for t in m.state_dict().values()]
    return state, len(calls), d.session if d is not None else None


def test_replay_is_invisible_to_the_user_and_to_the_other_collectors(tmp_path: Path) -> None:
    plain, plain_calls, _ = run(None)
    watched, calls, session = run(tmp_path / "d")
    assert plain_calls == calls == STEPS
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(a, b)  # weights and BatchNorm running statistics
    replay = session.section("activations")["replay"]
    assert replay["steps_replayed"] == STEPS
    assert [s["step"] for s in replay["steps"]] == list(range(STEPS))
    assert replay["lost_fraction"] > 0.05
    steps = session.steps
    assert all(s.get("micro_batches", 1) == 1 for s in steps), steps


def test_without_hooks_shares_tensors_and_drops_hooks() -> None:
    m = model()
    fired: list[str] = []
    m[0].register_forward_hook(lambda *a: fired.append("child"))
    m.register_forward_pre_hook(lambda *a: fired.append("root"))
    copy, origin = without_hooks(m)
    copy.eval()  # a copy's own attribute: the model stays in training mode
    assert m.training
    x = torch.randn(2, 8)
    m.eval()
    assert torch.equal(copy(x), m(x))
    assert fired == ["root", "child"]  # only the model's own call fired its hooks
    assert copy[0].weight is m[0].weight
    assert origin[id(copy[4])] is m[4]


def test_replays_spread_over_a_long_run() -> None:
    from ampdiag.sources.live.collectors.activations import _replays

    assert [n for n in range(100) if _replays(n)] == [*range(8), 8, 16, 32, 64]
