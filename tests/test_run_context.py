"""What collectors share through RunContext: one profiled-step rule, probes in their block."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ampdiag
from ampdiag.sources.live.collectors.base import running


def test_profiled_steps_agree_between_steps_and_profiler(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampdiag.diagnose(
        out=tmp_path,
        report=False,
        tensorboard=False,
        console=False,
        precision=False,
        numerics=False,
        speed_probe=False,
        profile_skip=1,
        profile_warmup=1,
        profile_active=2,
    ) as d:
        for _ in range(6):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert d.session is not None
    profiled = [s["index"] for s in d.session.steps if s["profiled"]]
    assert profiled == [2, 3]  # skip 1 + warm-up 1, then 2 recorded
    assert d.session.section("profiler")["recorded_steps"] == profiled
    assert d.run.trace_files and all(p.is_file() for p in d.run.trace_files)


def test_memory_probe_is_recorded_in_the_running_block_only(
    quiet_diagnose: Callable[..., Any],
) -> None:
    def make_batch(n: int) -> torch.Tensor:
        return torch.randn(n, 8)

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    outside = ampdiag.memory_probe(model, make_batch, batch_sizes=(2, 4))
    assert running() is None
    with quiet_diagnose(profile=False) as d:
        assert running() is d.run
        inside = ampdiag.memory_probe(model, make_batch, batch_sizes=(2, 4))
        model(make_batch(2)).sum().backward()
    assert running() is None
    assert d.session is not None
    probes = d.session.section("memory")["probes"]
    assert len(probes) == 1 and probes[0] is inside and probes[0] is not outside
