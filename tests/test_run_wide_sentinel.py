"""The sentinel watches the whole run when only a window of it is diagnosed.

A divergence at step 5 000 of a long run is what a window (``steps=``, ``trigger=``) is for,
but the step that holds the first inf/NaN is the one before the window (a loss-spike trigger
fires on it and opens the window at the next step), or any step outside a planned window. By
then the weights are NaN and the window's own collectors can only see NaN going in. So the
sentinel is not the window's: it watches every step, and the window's session says where the
first inf/NaN was made and whether FP32 held that step.

Truth from the loop itself (`tests.test_step_window.Loop`): it injects an inf into its own
code (``Net.forward`` multiplies ``body``'s output by ``poison`` before ``head``) at a step it
records, and records each step's loss and torch's installed hooks.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import ampdiag
from ampdiag.sources.live.diagnosis import make_config
from ampdiag.sources.live.loop import LoopWindow
from tests.test_step_window import QUIET, Loop, installed, plain, same_bits


def _divergence(session: ampdiag.Session) -> dict:  # type: ignore[type-arg]
    return session.section("derived")["divergence"]


def test_a_nan_before_a_planned_window_is_found_where_it_was_made(tmp_path: Path) -> None:
    nan_at, steps = 12, 40
    reference = plain(steps=steps, nan_at=nan_at)
    assert math.isfinite(reference.losses[nan_at - 1]) and not math.isfinite(
        reference.losses[nan_at]
    )
    assert all(not math.isfinite(v) for v in reference.losses[nan_at:])  # the truth: diverged
    loop = Loop(steps=steps, nan_at=nan_at)
    with ampdiag.diagnose(out=tmp_path, steps=(30, 35), **QUIET) as d:
        loop.run()
    assert same_bits(reference.params(), loop.params())
    session = d.session
    assert session is not None
    assert [s["index"] for s in session.steps] == list(range(30, 35))  # the window's steps
    sentinel = session.sections["sentinel"]
    assert sentinel["steps_watched"] == steps  # every step, not the window's 5
    fwd = sentinel["forward_origin"]
    assert (fwd["step"], fwd["module"], fwd["between"]) == (nan_at, "(Net)", ["body", "head"])
    div = _divergence(session)
    assert div["verdict"] == "diverged" and div["first"]["step"] == nan_at
    # The step was replayed in FP32 before its update: the inf is the loop's own, FP32 too.
    assert div["cause"]["replay_step"] == nan_at
    assert div["cause"]["cause"] == "not-precision"
    origin = next(f for f in session.all_findings() if f.id == "nonfinite-origin")
    assert origin.evidence["step"] == nan_at and origin.evidence["module"] == "(Net)"


def test_a_nan_after_the_window_closed_is_the_runs_end(tmp_path: Path) -> None:
    # More non-finite steps (115) than a session lists: the run's end is still known.
    nan_at, steps = 25, 140
    reference = plain(steps=steps, nan_at=nan_at)
    assert all(math.isfinite(v) for v in reference.losses[:nan_at])
    assert all(not math.isfinite(v) for v in reference.losses[nan_at:])
    loop = Loop(steps=steps, nan_at=nan_at)
    with ampdiag.diagnose(out=tmp_path, steps=(5, 10), **QUIET) as d:
        loop.run()
    assert same_bits(reference.params(), loop.params())
    assert d.session is not None
    assert all(math.isfinite(s["loss"]) for s in d.session.steps)  # the window was healthy
    div = _divergence(d.session)
    assert div["verdict"] == "diverged" and div["first"]["step"] == nan_at
    assert d.session.sections["sentinel"]["forward_origin"]["step"] == nan_at


def test_the_step_a_loss_spike_trigger_fires_on_is_the_origins(tmp_path: Path) -> None:
    nan_at, steps = 40, 60
    reference = plain(steps=steps, nan_at=nan_at)
    loop = Loop(steps=steps, nan_at=nan_at)
    with ampdiag.diagnose(out=tmp_path, trigger="loss-spike", trigger_steps=6, **QUIET) as d:
        loop.run()
    assert same_bits(reference.params(), loop.params())
    session = d.session
    assert session is not None
    assert session.sections["run"]["window"]["spike"]["step"] == nan_at
    assert [s["index"] for s in session.steps] == list(range(nan_at + 1, nan_at + 7))
    # Not the window's first module fed NaN weights (body.0 at step 41): the loop's own code.
    fwd = session.sections["sentinel"]["forward_origin"]
    assert (fwd["step"], fwd["module"], fwd["between"]) == (nan_at, "(Net)", ["body", "head"])
    assert _divergence(session)["cause"]["replay_step"] == nan_at


def test_a_framework_window_stops_the_run_wide_watch_when_it_closes(tmp_path: Path) -> None:
    before = installed()
    nan_at, steps = 40, 60
    reference = plain(steps=steps, nan_at=nan_at)
    loop = Loop(steps=steps, nan_at=nan_at)
    window = LoopWindow(make_config(None, {"trigger": "loss-spike", "trigger_steps": 4, **QUIET}))
    window.out = tmp_path
    window.begin(0)
    loop.run(before_step=window.step_begin, on_step=window.step_end)
    written = window.session  # written as the window closed, between two steps
    window.end()
    assert installed() == before
    assert same_bits(reference.params(), loop.params())
    assert written is not None and [s["index"] for s in written.steps] == list(range(41, 45))
    fwd = written.sections["sentinel"]["forward_origin"]
    assert (fwd["step"], fwd["module"]) == (nan_at, "(Net)")
    # The sentinel's hooks ran from the first step to the window's end, and nothing after.
    # (torch's module hooks only while the first step finds the model)
    first = loop.hooks[0]
    assert first[0] == before[0] + 1 and first[4]
    watching = (before[0], before[1], *first[2:])
    assert loop.hooks[1 : nan_at + 1] == [watching] * nan_at
    assert loop.hooks[46:] == [before] * (steps - 46)


@pytest.mark.parametrize("sentinel", [True, False], ids=["sentinel", "no-sentinel"])
def test_outside_the_window_only_the_sentinel_is_installed(tmp_path: Path, sentinel: bool) -> None:
    before = installed()
    loop = Loop(steps=24)
    with ampdiag.diagnose(out=tmp_path, steps=(10, 15), sentinel=sentinel, **QUIET) as d:
        loop.run()
    assert installed() == before
    outside = loop.hooks[:10] + loop.hooks[16:]
    if sentinel:  # the loss's backward patch; torch's module hooks on the first step alone
        assert outside[0][0] == before[0] + 1 and outside[0][1] == before[1] + 1
        assert len(set(outside[1:])) == 1  # the same before and after the window
        assert outside[1][:2] == before[:2] and outside[1][4]
    else:  # the step counter's optimizer post-hook alone
        assert len(set(outside)) == 1  # the same before and after the window
        assert outside[0] == (before[0], before[1], before[2], before[3] + 1, False)
    assert d.session is not None
    assert ("sentinel" in d.session.sections) is sentinel


def test_a_learning_rate_divergence_before_the_window_is_the_learning_rates(
    tmp_path: Path,
) -> None:
    # SGD at lr 1.0 on the loop's regression: the loss grows 0.2 -> 1e13 in 5 steps, then inf.
    def loop_at(lr: float) -> Loop:
        loop = Loop(steps=40)
        for group in loop.opt.param_groups:
            group["lr"] = lr
        return loop

    reference = loop_at(1.0)
    reference.run()
    first_bad = next(i for i, v in enumerate(reference.losses) if not math.isfinite(v))
    finite = reference.losses[:first_bad]
    assert len(finite) >= 3 and finite[-1] > 1000 * finite[0]  # the truth: it exploded first
    loop = loop_at(1.0)
    with ampdiag.diagnose(out=tmp_path, steps=(30, 35), **QUIET) as d:
        loop.run()
    assert same_bits(reference.params(), loop.params())
    assert d.session is not None
    div = _divergence(d.session)
    assert div["first"]["step"] == first_bad
    # The run's own losses before the window (none of them the window's) carry the trend.
    assert div["trend"]["steps"] == first_bad
    assert div["trend"]["first_loss"] == pytest.approx(finite[0], rel=1e-6)
    assert div["cause"]["cause"] == "not-precision"
    diverged = next(f for f in d.session.findings if f.id == "diverged")
    assert "learning rate" in diverged.fix.lower()


def test_the_verdict_says_the_step_is_outside_the_diagnosed_ones(tmp_path: Path) -> None:
    loop = Loop(steps=40, nan_at=12)
    with ampdiag.diagnose(out=tmp_path, steps=(30, 35), **QUIET) as d:
        loop.run()
    assert d.session is not None
    diverged = next(f for f in d.session.findings if f.id == "diverged")
    assert "at step 12" in diverged.title
    assert "before the diagnosed steps 30–34" in diverged.title
