"""The numerics report section and its TensorBoard data, from a real CPU fp16 run."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import ampdiag
from ampdiag.render.sections import numerics
from tests.render.conftest import without_our_script


class Odd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def test_section_figures_tables_and_tensorboard(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Odd())
    model.add_module("<script>", nn.Identity())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with ampdiag.diagnose(out=tmp_path, profile=False, console=False) as d:
        for i in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            scaler.scale(loss).backward()
            if i == 1:
                model[0].weight.grad[0, 0] = float("nan")
            scaler.step(opt)
            scaler.update()
    assert d.session is not None
    section = numerics.build(d.session)
    assert section is not None
    assert set(section.figures) == {"log2-grad-histogram"}  # the loss scale: GradScaler section
    assert "1/3 steps skipped" in section.summary
    html = (tmp_path / "report.html").read_text()
    assert 'id="numerics"' in html and "<code>&lt;script&gt;</code>" in html
    assert "<script>" not in without_our_script(html)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard" / tmp_path.name))
    acc.Reload()
    scales = [e.value for e in acc.Scalars("scaler/loss_scale")]
    assert scales == [256.0, 256.0, 128.0]
    assert [e.value for e in acc.Scalars("scaler/skipped")] == [0.0, 1.0, 0.0]
    # each quantity under one tag: the loss scale and the skips are not repeated elsewhere
    assert not [
        t
        for t in acc.Tags()["scalars"]
        if t.endswith(("loss_scale", "/skipped")) and not t.startswith("scaler/")
    ]
    assert "numerics/log2_grad_held" in acc.Tags()["histograms"]


def test_a_bf16_runs_underflow_figure_is_labelled_what_if(tmp_path: Path) -> None:
    """BF16 has FP32's range: the run itself computes in BF16 (set here), so FP16's
    underflow is a what-if and the summary must say so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Odd())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampdiag.diagnose(out=tmp_path, profile=False, console=False) as d:
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean() * 1e-9
            loss.backward()
            opt.step()
    assert d.session is not None
    section = numerics.build(d.session)
    assert section is not None
    assert section.summary.startswith("if this run used FP16 without loss scaling: underflow "), (
        section.summary
    )
