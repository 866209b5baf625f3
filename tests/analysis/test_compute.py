"""What the run computes in (`ampdiag.analysis.compute`), against the dtypes torch itself reports.

The finding that states the dtype at an inf/NaN (``nonfinite-origin``'s ``dtype``) must name the
dtype the run's parameters held, as ``Tensor.dtype`` says, also where no autocast ran: a model
cast to BF16 computes in BF16 (it used to be stated as float32, since no autocast was seen).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ampdiag.session import Session


class Square(nn.Module):
    """Squares its input (records whether that input was finite): past BF16's 3.4e38 at 1e20."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.finite_inputs = list[bool]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.finite_inputs.append(bool(torch.isfinite(x).all()))
        return (x * self.scale) ** 2


def test_a_nan_in_bf16_parameters_names_bfloat16(quiet_diagnose: Any) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Square(), nn.Linear(8, 1)).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with quiet_diagnose(model, opt) as d:
        for step in range(4):
            x = torch.randn(16, 8, dtype=torch.bfloat16) * (1e25 if step == 2 else 1.0)
            loss = model(x).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    truth = str(next(model.parameters()).dtype).removeprefix("torch.")
    finite = model[1].finite_inputs  # each forward's, the replays' included
    assert truth == "bfloat16" and finite[2], (truth, finite)  # Square's input at step 2
    session: Session = d.session
    origins = [f for f in session.all_findings() if f.id == "nonfinite-origin"]
    assert origins, [f.id for f in session.all_findings()]
    assert origins[0].evidence["module"] == "1", origins[0].evidence
    assert origins[0].evidence["dtype"] == truth, origins[0].evidence
    assert session.section("derived")["compute"]["precision"] == "bf16"
