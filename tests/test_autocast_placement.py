"""Autocast is seen wherever it is entered: the same diagnosis for the same computation.

Truth: the three placements of `tests.autocast_placement` compute bit-identical losses (checked
here), and the underflow share is counted from the gradients by the test itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.session import Session
from tests.autocast_placement import PLACEMENTS, SETTINGS, STEPS, train


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Session, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("placement")
    return {p: train(p, root / p) for p in PLACEMENTS}


def _verdict(session: Session) -> list[tuple[str, str]]:
    return sorted((f.id, f.severity) for f in session.all_findings())


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_fp16_findings_do_not_depend_on_where_autocast_is_entered(
    runs: dict[str, tuple[Session, dict[str, Any]]], placement: str
) -> None:
    session, truth = runs[placement]
    reference, ref_truth = runs["loop"]
    assert truth["losses"] == ref_truth["losses"]  # the same computation
    assert session.sections["run"]["autocast_seen"] == {"cpu:float16": STEPS}
    assert session.environment["autocast"] == "cpu:float16"
    found = {f.id: f for f in session.all_findings()}
    assert {"fp16-grad-underflow", "grad-scaler-missing"} <= set(found)
    got = found["fp16-grad-underflow"].evidence["param_grad_subnormal_fraction"]
    assert got == pytest.approx(truth["param_grad_subnormal_fraction"], abs=1e-6)
    assert truth["param_grad_subnormal_fraction"] > 0.2
    assert _verdict(session) == _verdict(reference)


class HalfAutocast(nn.Module):
    """The stem (the first module with parameters) runs outside autocast, the rest inside."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.body(h).float()


def _plain_run(tmp_path: Path, model: nn.Module, steps: int, **settings: Any) -> Session:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ampdiag.diagnose(out=tmp_path, **(SETTINGS | settings)) as d:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    assert d.session is not None
    return d.session


def test_autocast_around_part_of_the_model_is_seen(tmp_path: Path) -> None:
    torch.manual_seed(0)
    session = _plain_run(tmp_path, HalfAutocast(), steps=3)
    # Truth: the audit saw the body's matmuls run in bf16 with autocast active.
    assert session.sections["precision"]["autocast_dtypes"] == {"cpu": "bfloat16"}
    assert session.sections["run"]["autocast_seen"] == {"cpu:bfloat16": 3}
    assert session.environment["autocast"] == "cpu:bfloat16"


def test_each_forward_is_counted_once(tmp_path: Path) -> None:
    # Two forwards per step (gradient accumulation), the model found by itself.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    forwards = 0
    with ampdiag.diagnose(out=tmp_path, **SETTINGS) as d:
        for step in range(3):
            opt.zero_grad()
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=step != 1):
                    loss = model(torch.randn(4, 8)).float().pow(2).mean()
                forwards += 1
                loss.backward()
            opt.step()
    assert d.session is not None
    assert d.session.sections["run"]["autocast_seen"] == {"cpu:bfloat16": 4, "none": 2}
    assert forwards == 6
