"""``diagnose(steps=(A, B))`` and ``diagnose(trigger="loss-spike")``: a window of a long loop.

Truth measured without ampdiag: the loop records each step's loss itself, the step where it
injects a loss spike or a NaN (and the module), the parameters of the same loop run without
ampdiag, and torch's own hook dicts and ``Tensor.backward`` at every step (what is installed
while the window is closed).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import ampdiag
from ampdiag.sources.live.loss_spike import SpikeDetector

# The bound as DiagnoseConfig.trigger documents it (not read from the product's constants).
K, MAD_TO_SIGMA, FLOOR, HISTORY, MIN_HISTORY = 6.0, 1.4826, 0.05, 32, 8

QUIET: dict[str, Any] = {
    "report": False,
    "tensorboard": False,
    "console": False,
    "speed_probe_repeats": 1,
    "precision_ab_budget_s": 0.0,
}
ORIGINAL_BACKWARD = torch.Tensor.backward


def installed() -> tuple[int, int, int, int, bool]:
    """torch's global module and optimizer hooks, and whether ``Tensor.backward`` is patched."""
    return (
        len(nn_module._global_forward_pre_hooks),
        len(nn_module._global_forward_hooks),
        len(optim_module._global_optimizer_pre_hooks),
        len(optim_module._global_optimizer_post_hooks),
        torch.Tensor.backward is not ORIGINAL_BACKWARD,
    )


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 1)
        self.poison = 1.0  # inf for one step: the NaN is made in Net's own code, before `head`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x) * self.poison)


class Loop:
    """A plain training loop that records its own truth (losses, installed hooks)."""

    def __init__(
        self,
        steps: int,
        spike_at: int | None = None,
        nan_at: int | None = None,
        scaler: bool = False,
    ) -> None:
        torch.manual_seed(0)
        self.model = Net()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(steps, 16, 8, generator=g)
        self.y = self.x.sum(-1, keepdim=True) * 0.1 + 0.05 * torch.randn(steps, 16, 1, generator=g)
        self.steps, self.spike_at, self.nan_at = steps, spike_at, nan_at
        self.scaler = torch.amp.GradScaler("cpu") if scaler else None
        self.losses: list[float] = []
        self.hooks: list[tuple[int, int, int, int, bool]] = []

    def run(
        self,
        on_step: Callable[[int], None] | None = None,
        before_step: Callable[[int], None] | None = None,
    ) -> None:
        for i in range(self.steps):
            if before_step is not None:
                before_step(i)
            self.hooks.append(installed())
            x, y = self.x[i], self.y[i]
            if i == self.spike_at:
                y = y + 30.0  # the injected spike: a batch of wrong targets
            self.model.poison = math.inf if i == self.nan_at else 1.0
            self.opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = self.model(x)
            loss = nn.functional.mse_loss(out.float(), y)
            self.losses.append(float(loss.detach()))
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
            if on_step is not None:
                on_step(i)

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bit for bit (NaNs included: compared as integers)."""
    return len(a) == len(b) and all(
        torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b, strict=True)
    )


def plain(**kw: Any) -> Loop:
    loop = Loop(**kw)
    loop.run()
    return loop


@pytest.mark.parametrize("scaler", [False, True], ids=["optimizer-steps", "grad-scaler"])
def test_a_window_diagnoses_its_steps_and_nothing_else(tmp_path: Path, scaler: bool) -> None:
    before = installed()
    reference = plain(steps=24, scaler=scaler)
    loop = Loop(steps=24, scaler=scaler)
    # (the sentinel, which watches the whole run when on: tests/test_run_wide_sentinel.py)
    with ampdiag.diagnose(out=tmp_path, steps=(10, 15), sentinel=False, **QUIET) as d:
        loop.run()
    assert installed() == before
    # Training is the plain loop's, bit for bit.
    assert same_bits(reference.params(), loop.params())
    session = d.session
    assert session is not None and session.status == "ok"
    # The window's steps, under their run-wide numbers, with the losses the loop computed.
    assert [s["index"] for s in session.steps] == list(range(10, 15))
    assert [s["loss"] for s in session.steps] == pytest.approx(loop.losses[10:15], rel=1e-6)
    # Nothing of ampdiag's was installed before the window but the step counter (one optimizer
    # post-hook, and the GradScaler's update patch, which torch's dicts do not show) ...
    watch = (before[0], before[1], before[2], before[3] + 1, False)
    assert loop.hooks[:10] == [watch] * 10
    # ... every collector inside it (module hooks, the backward patch) ...
    assert all(h[0] > before[0] and h[4] for h in loop.hooks[11:15])
    # ... and the counter alone again after it.
    assert loop.hooks[16:] == [watch] * 8
    # The step settings count from the window: the profiler skipped 10, warmed up on 11.
    prof = session.sections["profiler"]
    assert prof["recorded_steps"] == [12, 13, 14]
    assert [r["step"] for r in prof["breakdown"]["steps"]] == [12, 13, 14]
    assert session.sections["precision"]["step"] == 11
    assert session.sections["run"]["window"]["opened_at"] == 10
    assert session.section("derived").get("verdict")  # analysed like any session


def test_steps_as_a_range_and_bad_windows() -> None:
    assert ampdiag.diagnose(out="unused", steps=range(3, 9)).config.steps == (3, 9)
    for bad in ((5, 5), (-1, 3), range(0, 10, 2), (1, 2, 3), "3-9"):
        with pytest.raises(ValueError):
            ampdiag.diagnose(out="unused", steps=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trigger"):
        ampdiag.diagnose(out="unused", trigger="loss-drop")


def test_a_window_never_reached_says_so(tmp_path: Path) -> None:
    reference = plain(steps=6)
    loop = Loop(steps=6)
    with ampdiag.diagnose(out=tmp_path, steps=(100, 120), **QUIET) as d:
        loop.run()
    assert same_bits(reference.params(), loop.params())
    session = ampdiag.load(tmp_path)
    assert session.steps == [] and d.session is not None
    (warning,) = session.sections["run"]["warnings"]
    assert "100 was never reached" in warning and "after step 5" in warning
    # the verdict names the window, not "no model ran": the loop ran its 6 steps
    (found,) = [f for f in d.session.findings if f.id == "nothing-measured"]
    assert found.severity == "high" and "100:120 never opened (6 steps ran)" in found.title


def test_d_step_marks_the_steps_of_a_window(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    with ampdiag.diagnose(out=tmp_path, steps=(3, 5), **QUIET) as d:
        for _ in range(8):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            with torch.no_grad():  # hand-written SGD: no optimizer, d.step() marks the steps
                for p in model.parameters():
                    p -= 0.1 * p.grad  # type: ignore[operator]
                    p.grad = None
            d.step()
    assert d.session is not None
    assert [s["index"] for s in d.session.steps] == [3, 4]


def test_the_spike_bound_is_the_documented_one() -> None:
    def fed(values: list[float]) -> SpikeDetector:
        detector = SpikeDetector()
        for i, v in enumerate(values):
            assert detector.add(i, v) is None
        return detector

    # Losses alternating 1.0 and 1.2: median 1.1, MAD 0.1 (floor 5% x 1.1 = 0.055 is lower).
    noisy = [1.0 + 0.2 * (i % 2) for i in range(HISTORY)]
    bound = 1.1 + K * MAD_TO_SIGMA * 0.1
    assert fed(noisy).add(100, bound - 1e-6) is None
    spike = fed(noisy).add(100, bound + 1e-6)
    assert spike is not None and spike.bound == pytest.approx(bound)
    assert spike.median == pytest.approx(1.1) and spike.mad == pytest.approx(0.1)
    # A flat loss: the floor (5% of the median) is the spread.
    flat = [2.0] * HISTORY
    assert fed(flat).add(40, 2.0 * (1 + K * FLOOR) - 1e-6) is None
    assert fed(flat).add(40, 2.0 * (1 + K * FLOOR) + 1e-6) is not None
    assert fed(flat).add(40, math.nan) is not None
    # The bound rests on the last 32 losses, older ones forgotten (computed here by hand).
    mixed = [100.0] * 50 + noisy[:16] + [3.0] * 16
    recent = mixed[-HISTORY:]
    m = statistics.median(recent)
    mad = statistics.median(abs(v - m) for v in recent)
    expected = m + K * max(MAD_TO_SIGMA * mad, FLOOR * m)
    assert fed(mixed).add(99, expected - 1e-6) is None
    assert fed(mixed).add(99, expected + 1e-6) is not None
    # Too short a history: only a non-finite loss is a spike.
    assert fed(flat[: MIN_HISTORY - 1]).add(9, 1e9) is None
    assert fed(flat[: MIN_HISTORY - 1]).add(9, math.inf) is not None


def test_loss_spike_trigger_diagnoses_the_steps_after_the_injected_spike(tmp_path: Path) -> None:
    spike_at, nan_at, steps = 40, 43, 60
    reference = plain(steps=steps, spike_at=spike_at, nan_at=nan_at)
    loop = Loop(steps=steps, spike_at=spike_at, nan_at=nan_at)
    with ampdiag.diagnose(
        out=tmp_path, trigger="loss-spike", trigger_steps=6, sample_every=1, **QUIET
    ) as d:
        loop.run()
    assert same_bits(reference.params(), loop.params())
    assert loop.losses[spike_at] > 10 * max(loop.losses[spike_at - 10 : spike_at])  # the truth
    session = d.session
    assert session is not None
    window = session.sections["run"]["window"]
    assert window["spike"]["step"] == spike_at
    assert window["spike"]["loss"] == pytest.approx(loop.losses[spike_at], rel=1e-6)
    # The detailed collectors ran on the steps after the spike, not before.
    assert [s["index"] for s in session.steps] == list(range(spike_at + 1, spike_at + 7))
    assert all(h[4] is True for h in loop.hooks[: spike_at + 1])  # the loss watch's patch only
    # torch's global module hooks only while the first step finds the model: none after it
    assert all(h[:2] == (0, 0) for h in loop.hooks[1 : spike_at + 1])
    # ... and found where the NaN injected at step 43 came from, with its run-wide step.
    origin = next(f for f in session.all_findings() if f.id == "nonfinite-origin")
    assert origin.evidence["step"] == nan_at and origin.evidence["module"] == "(Net)"
    assert origin.evidence["between"] == ["body", "head"]  # where Net's code multiplies
    # the header says which steps of the run these are, and why
    from ampdiag.render.sections.overview import run_facts

    first = f"6 steps (steps {spike_at + 1}–{spike_at + 6}"
    assert run_facts(session)[0] == f"{first}, after a loss spike at step {spike_at})"


def test_a_healthy_noisy_loss_never_triggers(tmp_path: Path) -> None:
    loop = Loop(steps=120)
    with ampdiag.diagnose(out=tmp_path, trigger="loss-spike", **QUIET) as d:
        loop.run()
    assert d.session is not None and d.session.steps == []
    assert d.session.sections["run"]["window"]["spike"] is None
    assert "never fired" in d.session.sections["run"]["warnings"][0]
    # a trigger that never fired is the healthy case: no gate may fail on it
    (found,) = [f for f in d.session.findings if f.id == "nothing-measured"]
    assert found.severity == "info" and "(120 steps ran)" in found.title
    assert not [f for f in d.session.findings if f.severity != "info"]


@pytest.mark.parametrize("fail_at", [12, 20], ids=["inside", "after"])
def test_an_error_inside_the_window_is_the_sessions_after_it_is_not(
    tmp_path: Path, fail_at: int
) -> None:
    before = installed()
    loop = Loop(steps=24)

    def fail(step: int) -> None:
        if step == fail_at:
            raise ValueError("boom")

    with (
        pytest.raises(ValueError, match="boom"),
        ampdiag.diagnose(out=tmp_path, steps=(10, 15), **QUIET),
    ):
        loop.run(on_step=fail)
    assert installed() == before
    session = ampdiag.load(tmp_path)
    if fail_at < 15:  # the window was open: its steps so far, and the user's error
        assert session.status == "error" and "boom" in str(session.error)
        assert [s["index"] for s in session.steps] == list(range(10, fail_at + 1))
    else:  # the window had closed whole before the error
        assert session.status == "ok"
        assert [s["index"] for s in session.steps] == list(range(10, 15))


def test_trigger_within_steps_opens_only_for_a_spike_inside_them(tmp_path: Path) -> None:
    # The loop's own losses (run without ampdiag): the injected spike at 20, and from step
    # 40 on losses within 10x of those before it.
    spiked = plain(steps=50, spike_at=20).losses
    assert spiked[20] > 100 * max(spiked[10:20]) and max(spiked[40:]) < 10 * max(spiked[10:20])
    loop = Loop(steps=50, spike_at=20)
    with ampdiag.diagnose(
        out=tmp_path, steps=(40, 50), trigger="loss-spike", trigger_steps=3, **QUIET
    ) as d:
        loop.run()
    assert d.session is not None and d.session.steps == []  # the spike at 20 is outside
    loop = Loop(steps=50, spike_at=44)
    with ampdiag.diagnose(
        out=tmp_path / "b", steps=(40, 50), trigger="loss-spike", trigger_steps=3, **QUIET
    ) as d:
        loop.run()
    assert d.session is not None
    assert [s["index"] for s in d.session.steps] == [45, 46, 47]


def test_the_last_optimizer_hook_removed_inside_its_own_call_waits() -> None:
    # A window closing at its last step's boundary removes ampdiag's callbacks from inside
    # torch's loop over its optimizer hooks: removing torch's hook right then would make the
    # user's optimizer.step() raise ("dictionary changed size during iteration").
    from ampdiag.sources.live import global_hooks

    before = len(optim_module._global_optimizer_post_hooks)
    handles: list[global_hooks.Handle] = []
    handles.append(global_hooks.add(global_hooks.OPTIMIZER_POST, lambda o: handles[0].remove()))
    calls: list[int] = []  # the user's own global hook, after ampdiag's in torch's dict
    theirs = optim_module.register_optimizer_step_post_hook(lambda o, a, k: calls.append(1))
    try:
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()  # no error, and the user's hook after ours still ran
        assert calls == [1]
        assert len(optim_module._global_optimizer_post_hooks) == before + 2  # removal waited
        global_hooks.block_started()  # the next safe point removes it
        global_hooks.block_ended()
        assert len(optim_module._global_optimizer_post_hooks) == before + 1
    finally:
        theirs.remove()


def test_a_window_on_one_rank_writes_into_its_rank_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ampdiag.sources.live import diagnosis

    monkeypatch.setattr(diagnosis, "distributed_info", lambda: {"world_size": 2, "rank": 1})
    with ampdiag.diagnose(out=tmp_path, steps=(2, 4), **QUIET) as d:
        Loop(steps=6).run()
    assert d.out == tmp_path / "rank-1" and not (tmp_path / "rank-1" / "rank-1").exists()
    assert [s["index"] for s in ampdiag.load(tmp_path / "rank-1" / "session.json").steps] == [2, 3]


def test_a_window_opening_mid_run_under_torch_compile_adds_no_graph_break(
    tmp_path: Path,
) -> None:
    # dynamo's own counters, the plain compiled loop against the same loop with a window.
    import contextlib

    from torch._dynamo.utils import counters

    from tests.compat_suite.test_compile import compiled_loop

    torch.manual_seed(0)
    plain_run = compiled_loop(contextlib.nullcontext(), "aot_eager", True, steps=10)
    plain_stats = dict(counters["stats"])
    torch.manual_seed(0)
    block = ampdiag.diagnose(out=tmp_path, steps=(4, 7), **QUIET)
    windowed = compiled_loop(block, "aot_eager", True, steps=10)
    assert windowed["graph_breaks"] == plain_run["graph_breaks"] == 0
    assert dict(counters["stats"]) == plain_stats  # no recompilation either
    assert same_bits(plain_run["losses"], windowed["losses"])
    params = [list(r["model"].parameters()) for r in (plain_run, windowed)]
    assert same_bits([p.detach() for p in params[0]], [p.detach() for p in params[1]])
    assert [s["index"] for s in ampdiag.load(tmp_path).steps] == [4, 5, 6]
