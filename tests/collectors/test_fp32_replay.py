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


class OwnAutocast(nn.Module):
    """A forward that enters FP16 autocast itself, optionally through a checkpoint."""

    def __init__(self, reentrant: bool | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            if self.reentrant is None:
                return self.net(x)
            from torch.utils.checkpoint import checkpoint

            out: torch.Tensor = checkpoint(self.net, x, use_reentrant=self.reentrant)
            return out


def fp32_truth(net: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Module, torch.Tensor]:
    """The gradient entering each module of ``net`` in a plain FP32 forward and backward."""
    outs: dict[nn.Module, torch.Tensor] = {}
    handles = [
        m.register_forward_hook(lambda m, a, o: outs.__setitem__(m, o)) for m in net.modules()
    ]
    out = net(x)
    for h in handles:
        h.remove()
    grads = torch.autograd.grad(out, list(outs.values()), grad_outputs=g)
    return dict(zip(outs, grads, strict=True))


def test_replay_holds_off_the_autocast_a_forward_enters() -> None:
    from ampdiag.sources.live.collectors.fp32_replay import reference_gradients

    torch.manual_seed(0)
    m = OwnAutocast()
    x, g = torch.randn(5, 8), torch.randn(5, 4) * 1e-9  # FP16 would flush most of g
    assert m(x).dtype == torch.float16  # the forward does compute in FP16
    found = {id(mod): grad for mod, grad, _ in reference_gradients(m, (x,), g, 1 << 20)}
    plain = nn.Sequential(*m.net)  # the same modules, their class forward, no autocast
    for mod, want in fp32_truth(plain, x, g).items():
        got = found[id(mod) if mod is not plain else id(m.net)]
        assert got.dtype == torch.float32
        assert torch.allclose(got.reshape(-1), want.reshape(-1), rtol=1e-5, atol=0)
    assert not torch.is_autocast_enabled("cpu")  # as found


def test_replay_of_a_forward_whose_checkpoint_would_recompute_in_fp16_says_why() -> None:
    import pytest

    from ampdiag.sources.live.collectors.fp32_replay import ReplayError, reference_gradients

    x, g = torch.randn(5, 8).requires_grad_(), torch.randn(5, 4)
    with pytest.raises(ReplayError, match="checkpointed segment"):
        reference_gradients(OwnAutocast(reentrant=True), (x,), g, 1 << 20)
    with pytest.raises(Exception):  # torch's own check: the recomputed dtypes differ  # noqa: B017
        reference_gradients(OwnAutocast(reentrant=False), (x,), g, 1 << 20)


def test_autocast_held_off_leaves_the_state_as_found_on_error() -> None:
    import pytest

    from ampdiag.compat.autocast import AutocastHeldOff

    a = torch.randn(3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError), AutocastHeldOff() as held:
            assert torch.mm(a, a).dtype == torch.float32
            assert torch.is_autocast_enabled("cpu")  # the code's own state, between calls
            torch.mm(a, torch.randn(2, 2))  # raises inside the call
        assert held.entered and held.low is None
        assert torch.is_autocast_enabled("cpu") and torch.mm(a, a).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_replay_of_accelerates_prepared_model_is_fp32(tmp_path: Path) -> None:
    """A real ``Accelerator(mixed_precision="bf16").prepare`` (its CPU autocast): the replay's
    gradients are the plain model's FP32 ones, and the prepared model is left as it was."""
    import pytest

    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    from ampdiag.sources.live.collectors.fp32_replay import reference_gradients

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        plain = nn.Sequential(*net)
        prepared = accelerate.Accelerator(mixed_precision="bf16", cpu=True).prepare(net)
        x, g = torch.randn(5, 8), torch.randn(5, 4)
        assert prepared(x).dtype == torch.float32  # converted back, computed in BF16
        wrapped = prepared.forward
        found = {id(m): t for m, t, _ in reference_gradients(prepared, (x,), g, 1 << 20)}
        assert prepared.forward == wrapped and "_original_forward" in vars(prepared)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    for mod, want in fp32_truth(plain, x, g).items():
        got = found[id(prepared) if mod is plain else id(mod)]
        assert torch.allclose(got.reshape(-1), want.reshape(-1), rtol=1e-5, atol=0)
