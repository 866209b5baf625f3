"""The charts a person looks for first: the loss per step, and step time that one slow step does
not flatten, with the profiled steps marked.

Truth: what each loop did itself — the losses it computed, the step it slowed down with a sleep,
the step whose loss it made infinite, and the schedule it gave the profiler.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.render.sections import overview
from ampdiag.render.sections import time as time_section

QUIET = {"console": False, "tensorboard": False, "speed_probe": False}


def loop(out: Path, steps: int, *, sleep_at: int | None = None, inf_at: int | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    losses: list[float] = []
    with ampdiag.diagnose(
        out=out, profile_skip=1, profile_warmup=1, profile_active=2, **QUIET
    ) as d:
        for i in range(steps):
            if i == sleep_at:
                time.sleep(1.0)
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            if i == inf_at:
                loss = loss * float("inf")
            losses.append(loss.item())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return d, losses


def test_every_live_report_has_the_loss_chart_of_the_run(tmp_path) -> None:
    d, losses = loop(tmp_path / "r", 8, inf_at=5)
    chart = overview.figures(d.session)["loss"]
    finite = [(i, v) for i, v in enumerate(losses) if math.isfinite(v)]
    assert list(chart.x) == [i for i, _ in finite]
    (drawn,) = [v for _, v in chart.series]
    assert drawn == pytest.approx([v for _, v in finite], rel=1e-6)
    assert 5 in chart.marks  # the scaler skipped the step whose loss was inf
    assert [(a, b) for a, b, _ in chart.bands] == [(5.0, 5.0)]  # and it is the first inf/NaN
    html = (d.out / "report.html").read_text()
    overview_html = html[html.index('<section id="overview">') :]
    overview_html = overview_html[: overview_html.index("</section>")]
    assert 'aria-label="loss"' in overview_html


def test_a_slow_first_step_does_not_flatten_step_time(tmp_path) -> None:
    d, _ = loop(tmp_path / "r", 10, sleep_at=0)
    chart = time_section.figures(d.session)["step-times"]
    (walls,) = [v for _, v in chart.series]
    rest = sorted(walls[1:])
    assert walls[0] > 1000  # the loop slept 1 s in step 0
    assert chart.ymax is not None and chart.ymax < walls[0] and chart.ymax >= rest[-1]
    assert "step 0:" in chart.note
    # profile_skip=1, profile_warmup=1, profile_active=2: torch records steps 2 and 3
    assert [(a, b) for a, b, _ in chart.bands] == [(2.0, 3.0)]
    svg = ampdiag.render.svg.draw(chart)
    ticks = [float(t.replace(",", "")) for t in re.findall(r'text-anchor="end">([\d.,]+)<', svg)]
    assert max(ticks) < walls[0]  # the value axis stops below the outlier


def test_no_outlier_keeps_the_whole_scale() -> None:
    assert time_section.outlier_ceiling([10.0, 11.0, 12.0, 10.5]) == (None, [])


def test_the_trace_is_one_click_away(tmp_path) -> None:
    d, _ = loop(tmp_path / "r", 5)
    html = (d.out / "report.html").read_text()
    links = re.findall(r'<a class="trace" href="([^"]+)"', html)
    assert links and all((d.out / link).is_file() for link in links)
    assert {(d.out / link).resolve() for link in links} == {
        p.resolve() for p in (d.out / "trace").glob("*.pt.trace.json*")
    }
    assert "Perfetto" in html
