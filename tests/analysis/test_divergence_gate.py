"""A diverged run is a verdict people and CI see: ``--fail-on`` fails on it, and the status
line says ``diverged``, never a bare ``ok``.

Truth: the run is measured here without ampdiag to reach a non-finite loss (and the same run
at a tenth of the learning rate to stay finite), so the gate is checked against what the
training did, not against the product's thresholds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.cli import main
from ampdiag.render.console import summary

QUIET = {"report": False, "tensorboard": False, "console": False, "speed_probe": False}


def train(lr: float) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(12):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("lr", [30.0, 3.0])
def test_fail_on_sees_a_diverged_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lr: float
) -> None:
    diverges = not math.isfinite(train(lr)[-1])  # measured without ampdiag
    assert diverges == (lr == 30.0)
    with ampdiag.diagnose(out=tmp_path, **QUIET) as d:
        train(lr)
    assert d.session is not None and d.session.status == "ok"
    line = summary(d.session).splitlines()[0]
    assert ("verdict diverged" in line) == diverges, line
    assert "status ok" not in line
    code = main(["report", str(tmp_path), "--format", "json", "--fail-on", "high"])
    err = capsys.readouterr().err
    assert (code == 3 and "diverged" in err) if diverges else "diverged" not in err, (code, err)
