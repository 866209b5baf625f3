"""The weight_updates collector: lost updates of BF16/FP16 weights, counted against the loop's
own count; what it must not count (frozen weights, weights with an FP32 master copy); and
that watching changes nothing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.sources.live.collectors import weight_updates as wu

QUIET: dict[str, Any] = {
    "profile": False,
    "report": False,
    "tensorboard": False,
    "console": False,
    "speed_probe": False,
    "sample_every": 1,
}


def _data(steps: int, dim: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(8, dim, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)
    ]


def _train(
    model: nn.Module, opt: torch.optim.Optimizer, data: list[Any], count: list[tuple[int, int]]
) -> None:
    """One step per batch; appends (nonzero-gradient elements, those left unchanged)."""
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        dtype = next(model.parameters()).dtype
        loss = (model(x.to(dtype)).float() - y).pow(2).mean()
        loss.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        before = [p.detach().clone() for p in params]
        grads = [p.grad.detach().clone() for p in params if p.grad is not None]
        opt.step()
        moving = sum(int((g != 0).sum()) for g in grads)
        same = sum(
            int(((g != 0) & (p.detach() == b)).sum())
            for p, b, g in zip(params, before, grads, strict=True)
        )
        count.append((moving, same))


def test_lost_updates_are_counted_exactly_on_small_parameters(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    count: list[tuple[int, int]] = []
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        _train(model, opt, _data(5), count)
    assert d.session is not None
    sec = d.session.section("weight_updates")
    # every parameter is under MAX_ELEMENTS and every step sampled: the counts are the loop's
    assert [(s["elements"], s["unchanged"]) for s in sec["steps"]] == count
    assert sec["unchanged"] == sum(u for _, u in count) > 0
    (row,) = sec["optimizers"]
    assert row["low_precision_params"] == 4 and row["dtypes"] == {"bfloat16": 4}
    assert row["low_precision_numel"] == sum(p.numel() for p in model.parameters())
    f = next(f for f in d.session.all_findings() if f.id == "low-precision-params")
    assert f.evidence["unchanged_share"] == round(
        sum(u for _, u in count) / sum(m for m, _ in count), 6
    )


def test_a_large_parameter_is_sampled_within_the_bound(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 64), nn.Linear(64, 4)).to(torch.bfloat16)  # 32768: sampled
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    count: list[tuple[int, int]] = []
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        _train(model, opt, _data(3, dim=512), count)
    assert d.session is not None
    sec = d.session.section("weight_updates")
    for s, (moving, same) in zip(sec["steps"], count, strict=True):
        assert s["elements"] <= 4 * wu.MAX_ELEMENTS  # at most MAX_ELEMENTS per parameter
        assert abs(s["unchanged_share"] - same / moving) < 0.03


def test_training_is_unchanged_by_watching(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(torch.bfloat16)
    twin = copy.deepcopy(model)
    data = _data(4)
    _train(twin, torch.optim.AdamW(twin.parameters(), lr=1e-3), data, [])
    with ampdiag.diagnose(out=tmp_path, **QUIET):
        _train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), data, [])
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_frozen_low_precision_weights_beside_fp32_ones_are_not_flagged(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    """A frozen 16-bit base with an FP32 head (adapter-style): the optimizer updates FP32 only."""
    torch.manual_seed(0)
    base = nn.Linear(16, 16).to(dtype).requires_grad_(False)
    head = nn.Linear(16, 4)
    model = nn.Sequential(base, head)

    class Mixed(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return head(base(x.to(dtype)).float())

    net = Mixed()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)  # given every parameter, frozen too
    with ampdiag.diagnose(model=model, out=tmp_path, **QUIET) as d:
        for x, y in _data(3):
            opt.zero_grad()
            (net(x) - y).pow(2).mean().backward()
            opt.step()
    assert d.session is not None
    (row,) = d.session.section("weight_updates")["optimizers"]
    assert row["low_precision_in_optimizer"] == 2 and row["low_precision_params"] == 0
    assert "low-precision-params" not in {f.id for f in d.session.all_findings()}


class MasterSGD(torch.optim.Optimizer):
    """SGD on BF16 parameters through FP32 master copies kept in its state."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "master" not in state:
                    state["master"] = p.detach().float().clone()
                state["master"].add_(p.grad.float(), alpha=-group["lr"])
                p.copy_(state["master"])


def test_weights_with_an_fp32_master_copy_are_not_counted(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(torch.bfloat16)
    opt = MasterSGD(model.parameters(), lr=1e-4)
    count: list[tuple[int, int]] = []
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        _train(model, opt, _data(4), count)
    assert d.session is not None
    # the fault would be there without the master copy: most stored values do not move
    assert sum(u for _, u in count) / sum(m for m, _ in count) > 0.5
    sec = d.session.section("weight_updates")
    (row,) = sec["optimizers"]
    assert row["master_params"] == 4
    assert sec["steps_measured"] == 0  # step 0's copies dropped once the masters were seen
    assert "low-precision-params" not in {f.id for f in d.session.all_findings()}
