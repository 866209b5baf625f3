"""A long run stays flat: bounded records that span the whole run, no tensor kept per step."""

from __future__ import annotations

import gc
import itertools
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.sources.live.collectors import gradients
from ampdiag.sources.live.steps import BATCH, StepLog


def test_the_step_log_stays_bounded_and_spans_the_run() -> None:
    log = StepLog(cap=1000)
    for i in range(100_000):
        log.saw_loss(torch.tensor(float(i)), from_scaler=False)
        log.end(i, 0.001, profiled=False, sampled=False)
    records = log.records()
    assert len(records) <= 1000
    indices = [r["index"] for r in records]
    assert indices[0] == 0 and indices[-1] >= 100_000 - 2 * (100_000 // 1000)
    stride = indices[1] - indices[0]
    assert all(b - a == stride for a, b in itertools.pairwise(indices))
    # Each kept step carries its own loss (the loss of step i was i).
    assert all(r["loss"] == float(r["index"]) for r in records)


def test_loss_tensors_are_not_kept_past_a_batch() -> None:
    log = StepLog(cap=10_000)
    refs = []
    for i in range(3 * BATCH + 5):
        loss = torch.tensor(float(i))
        refs.append(weakref.ref(loss))
        log.saw_loss(loss, from_scaler=False)
        log.end(i, 0.001, profiled=False, sampled=False)
        del loss
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive <= BATCH  # only the batch not yet packed
    assert [r["loss"] for r in log.records()] == [float(i) for i in range(3 * BATCH + 5)]


@pytest.mark.slow
def test_a_long_live_run_keeps_bounded_records_and_counts_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gradients, "MAX_STEP_RECORDS", 20)
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=50)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    losses = []
    steps = 1500
    with ampdiag.diagnose(
        out=tmp_path / "run",
        max_steps_recorded=200,
        profile=False,
        precision=False,
        speed_probe=False,
        report=False,
        tensorboard=False,
        console=False,
    ) as d:
        for _ in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            losses.append(loss.item())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    session = d.session
    assert session is not None
    assert len(session.steps) <= 200
    assert session.steps[-1]["index"] >= steps - 2 * steps // 200
    assert all(s["loss"] == losses[s["index"]] for s in session.steps)
    sc = session.section("scaler")
    assert len(sc["history"]) <= 200
    assert sc["steps_total"] == steps
    # growth_interval=50 and no inf: the scale grew every 50 steps, all counted.
    assert sc["growth_total"] == steps // 50
    assert sc["skipped_total"] == 0
    assert len(session.section("memory")["batches"]) <= 1000
    sampled = [s["step"] for s in session.section("gradients")["steps"]]
    assert len(sampled) <= 20
    assert sampled[-1] >= steps - 2 * 20 * 2  # the records reach the end of the run
