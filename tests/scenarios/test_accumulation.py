"""Gradient accumulation, beyond the findings (those are the corpus's: sc_accumulation.py):
the step records (backward passes per step, the step loss), bit-identical training, a run
without accumulation, two losses of one forward, and that no accumulation advice is given to a
broken run although its memory figures alone would call for it.

Truth: measured by the training loop itself (`tests.scenarios.accumulation`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from ampdiag.analysis import analyze
from ampdiag.session import Session
from tests.scenarios.accumulation import STEPS, N, data, model, train
from tests.scenarios.harness import diagnose

ACCUMULATION_IDS = {"grad-accumulation-broken", "accumulation-loss-not-averaged"}


def ids(session: Session) -> set[str]:
    return {f.id for f in session.all_findings()}


@pytest.mark.parametrize(("mode", "scaler"), [("average", False), ("sum", True)])
def test_step_records(mode: str, scaler: bool, tmp_path: Path) -> None:
    dtype = torch.float16 if scaler else torch.bfloat16
    _, session, truth = train(mode, out=tmp_path, dtype=dtype, scaler=scaler)
    assert session is not None
    assert [s["micro_batches"] for s in session.steps] == truth["backward_passes"]
    # the step loss: what the optimizer follows, the mean of the micro-batches' losses when
    # they are averaged, N times it when summed
    weight = 1 if mode == "average" else N
    for rec, want in zip(session.steps, truth["mean_loss"], strict=True):
        assert rec["loss"] == pytest.approx(weight * want, rel=1e-4)
    assert session.section("accumulation")["steps"]  # the measurement ran


def test_no_advice_to_a_broken_run_that_memory_alone_would_get(tmp_path: Path) -> None:
    _, session, _ = train(
        "zero_none",
        out=tmp_path,
        micro=[8, 16] * (STEPS // 2),
        memory_target_batch=10**6,
        memory_limit_bytes=64 * 2**20,
        measure=False,
    )
    assert session is not None
    assert "grad-accumulation-broken" in ids(session)
    assert "use-grad-accumulation" not in ids(session)
    # without the broken accumulation the same memory figures would advise it
    session.sections.pop("accumulation")
    assert "use-grad-accumulation" in {f.id for f in analyze(session)}


def test_plain_run_has_one_micro_batch_and_is_silent(tmp_path: Path) -> None:
    _, session, truth = train("average", out=tmp_path, accum=1)
    assert session is not None
    assert truth["backward_passes"] == [1] * STEPS
    assert [s["micro_batches"] for s in session.steps] == [1] * STEPS
    for rec, want in zip(session.steps, truth["mean_loss"], strict=True):
        assert rec["loss"] == pytest.approx(want, rel=1e-4)
    assert not ids(session) & ACCUMULATION_IDS


@pytest.mark.parametrize("mode", ["average", "zero_none"])
def test_training_is_bit_identical(mode: str, tmp_path: Path) -> None:
    watched, _, _ = train(mode, out=tmp_path, measure=False, scaler=True, dtype=torch.float16)
    plain, _, _ = train(mode, out=None, measure=False, scaler=True, dtype=torch.float16)
    for a, b in zip(watched.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_two_losses_of_one_forward_are_not_micro_batches(tmp_path: Path) -> None:
    # Two backward passes per step, each of an undivided loss, but one forward: not
    # accumulation, so neither finding (truth: the loop counts its forwards itself).
    settings: dict[str, Any] = {"speed_probe": False}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        forwards = []
        with diagnose(tmp_path, **settings) as d:
            for step in data(8):
                x, y = step[0]
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out_ = m(x)
                forwards.append(1)
                F.cross_entropy(out_.float(), y).backward(retain_graph=True)
                out_.float().square().mean().backward()
                opt.step()
    assert d.session is not None
    assert [s["micro_batches"] for s in d.session.steps] == [2] * STEPS
    assert len(forwards) == STEPS
    assert not ids(d.session) & ACCUMULATION_IDS
