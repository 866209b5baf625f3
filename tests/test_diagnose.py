import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import ampdiag
from ampdiag.errors import OutputError
from tests.conftest import train


def global_hooks() -> dict[str, int]:
    return {
        "module_pre": len(nn_module._global_forward_pre_hooks),
        "module_post": len(nn_module._global_forward_hooks),
        "optim_pre": len(optim_module._global_optimizer_pre_hooks),
        "optim_post": len(optim_module._global_optimizer_post_hooks),
    }


ORIGINALS = {
    "backward": torch.Tensor.backward,
    "scale": torch.amp.GradScaler.scale,
    "update": torch.amp.GradScaler.update,
}


def assert_clean(before: dict[str, int]) -> None:
    assert global_hooks() == before
    assert torch.Tensor.backward is ORIGINALS["backward"]
    assert torch.amp.GradScaler.scale is ORIGINALS["scale"]
    assert torch.amp.GradScaler.update is ORIGINALS["update"]
    assert not torch.autograd.profiler._is_profiler_enabled


@pytest.mark.parametrize(
    ("dtype", "use_scaler", "autocast"),
    [
        (None, False, None),
        (torch.bfloat16, False, "cpu:bfloat16"),
        (torch.float16, True, "cpu:float16"),
    ],
    ids=["fp32", "bf16", "fp16-scaler"],
)
def test_end_to_end(
    tmp_path: Path, dtype: torch.dtype | None, use_scaler: bool, autocast: str | None
) -> None:
    before = global_hooks()
    out = tmp_path / "run"
    holder: dict[str, ampdiag.Diagnosis] = {}

    def wrap() -> ampdiag.Diagnosis:
        holder["d"] = ampdiag.diagnose(out=out, console=False)
        return holder["d"]

    train(steps=6, dtype=dtype, use_scaler=use_scaler, wrap=wrap)
    d = holder["d"]
    assert_clean(before)
    s = d.session
    assert s is not None and s.status == "ok"
    # One step per optimizer step (or per scaler.update()), each with its loss.
    assert [st["index"] for st in s.steps] == list(range(6))
    assert all(isinstance(st["loss"], float) and st["loss"] > 0 for st in s.steps)
    assert s.environment["autocast"] == autocast
    run = s.section("run")
    assert run["models"][0]["class"] == "TinyNet"
    assert run["optimizers"] == ["AdamW"]
    assert (run["scaler"] is not None) == use_scaler
    # Files: session, report, tensorboard events, gzipped trace in the plugin's layout.
    assert (out / "session.json").is_file() and (out / "report.html").is_file()
    assert list((out / "tensorboard" / out.name).glob("events.out.tfevents.*"))
    traces = list((out / "trace").glob("*.pt.trace.json.gz"))
    assert len(traces) == 1
    trace = json.loads(gzip.decompress(traces[0].read_bytes()))
    steps_in_trace = {
        e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
    }
    assert steps_in_trace == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}
    prof = s.section("profiler")
    assert prof["recorded_steps"] == [2, 3, 4]
    bd = prof["breakdown"]
    assert [r["step"] for r in bd["steps"]] == [2, 3, 4]
    for row in bd["steps"]:  # the categories partition the step
        parts = sum(row[f"{c}_us"] for c in ("forward", "backward", "optimizer", "data", "other"))
        assert parts == pytest.approx(row["total_us"], rel=1e-6)
        assert row["forward_us"] > 0 and row["backward_us"] > 0 and row["optimizer_us"] > 0
    names = {op["name"] for op in prof["top_ops"]}
    assert "aten::addmm" in names or "aten::linear" in names
    assert ampdiag.load(out).to_dict() == s.to_dict()


@pytest.mark.slow
def test_parameters_bit_identical_with_and_without(tmp_path: Path) -> None:
    for dtype, scaler in ((None, False), (torch.float16, True)):
        plain = train(steps=4, dtype=dtype, use_scaler=scaler)
        watched = train(
            steps=4,
            dtype=dtype,
            use_scaler=scaler,
            wrap=lambda: ampdiag.diagnose(out=tmp_path / "x", console=False),
        )
        for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
            assert torch.equal(a, b)


def test_exception_is_reraised_unchanged_and_session_written(tmp_path: Path) -> None:
    before = global_hooks()
    boom = RuntimeError("boom <b>")
    out = tmp_path / "err"
    with pytest.raises(RuntimeError) as info:
        train(steps=6, fail_at=4, exc=boom, wrap=lambda: ampdiag.diagnose(out=out, console=False))
    assert info.value is boom
    assert_clean(before)
    s = ampdiag.load(out)
    assert s.status == "error"
    assert s.error is not None and s.error["type"] == "RuntimeError"
    assert s.error["message"] == "boom <b>"
    assert len(s.steps) == 4
    html = (out / "report.html").read_text()
    assert "boom &lt;b&gt;" in html and "boom <b>" not in html
    # The profiler was mid-window when the error came: its trace was still written.
    assert s.section("profiler")["trace_files"]


def test_keyboard_interrupt_is_interrupted(tmp_path: Path) -> None:
    before = global_hooks()
    with pytest.raises(KeyboardInterrupt):
        train(
            steps=3,
            fail_at=1,
            exc=KeyboardInterrupt(),
            wrap=lambda: ampdiag.diagnose(out=tmp_path, console=False),
        )
    assert_clean(before)
    assert ampdiag.load(tmp_path).status == "interrupted"


def test_unwritable_out_fails_before_the_first_step(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    ran = []
    before = global_hooks()
    with (
        pytest.raises(OutputError, match="cannot write the output folder"),
        ampdiag.diagnose(out=blocker / "sub"),
    ):
        ran.append(1)
    assert ran == []
    assert_clean(before)


def test_manual_steps_without_optimizer(quiet_diagnose: Callable[..., Any]) -> None:
    model = torch.nn.Linear(4, 4)
    with quiet_diagnose() as d:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            d.step()
    assert d.session is not None
    assert len(d.session.steps) == 3
    assert d.session.section("run")["models"][0]["class"] == "Linear"
    assert not d.report_path.exists()


def test_unknown_setting_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unknown settings"):
        ampdiag.diagnose(profile_steps=3)


def test_config_object_with_overrides_on_top() -> None:
    from dataclasses import asdict, fields

    from ampdiag.config import Settings

    base = ampdiag.DiagnoseConfig(profile_active=7, report=False)
    d = ampdiag.diagnose(out="unused", config=base, report=True, sample_every=3)
    assert (d.config.profile_active, d.config.report, d.config.sample_every) == (7, True, 3)
    assert base.report is False  # the given config is not modified
    assert asdict(ampdiag.diagnose(out="unused").config) == asdict(ampdiag.DiagnoseConfig())
    # the typed overrides name exactly the config's fields
    assert set(Settings.__annotations__) == {f.name for f in fields(ampdiag.DiagnoseConfig)}
    with pytest.raises(TypeError, match="takes a DiagnoseConfig"):
        ampdiag.diagnose(config={"report": False})  # type: ignore[arg-type]


def test_short_run_says_nothing_was_profiled(tmp_path: Path) -> None:
    train(steps=1, wrap=lambda: ampdiag.diagnose(out=tmp_path, console=False))
    s = ampdiag.load(tmp_path)
    assert [f.id for f in s.findings] == ["profiler-no-steps"]


def test_run_ending_inside_the_profiler_window_keeps_only_real_steps(tmp_path: Path) -> None:
    # 3 steps: skip step 0, warm up on 1, record 2 (the window of 3 active steps is cut short).
    train(steps=3, wrap=lambda: ampdiag.diagnose(out=tmp_path, console=False))
    prof = ampdiag.load(tmp_path).section("profiler")
    assert prof["recorded_steps"] == [2]
    assert [r["step"] for r in prof["breakdown"]["steps"]] == [2]
    assert all(not op["name"].startswith("ProfilerStep") for op in prof["top_ops"])


def test_each_rank_writes_its_own_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    d = ampdiag.diagnose(out=tmp_path, console=False, profile=False)
    train(steps=2, wrap=lambda: d)
    assert d.out == tmp_path / "rank-3"
    env = ampdiag.load(tmp_path / "rank-3").environment
    assert (env["rank"], env["world_size"]) == (3, 4)


@pytest.mark.slow
def test_a_second_run_into_the_same_folder_lists_only_its_own_trace(tmp_path: Path) -> None:
    for _ in range(2):
        train(steps=6, wrap=lambda: ampdiag.diagnose(out=tmp_path, console=False))
    s = ampdiag.load(tmp_path)
    assert len(list((tmp_path / "trace").glob("*.pt.trace.json.gz"))) == 2
    assert len(s.section("profiler")["trace_files"]) == 1
    assert len(list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))) == 1


def test_a_block_inside_another_leaves_the_outer_one_every_step_and_loss(tmp_path: Path) -> None:
    """Two blocks in one thread (a window's inside the run-wide one) patch the same calls.

    The inner block's patches must hand each call on to the outer's: the outer block records
    every step and loss of its span, the inner one its own, against the loop's loss.item().
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    losses: list[float] = []

    def step() -> None:
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        losses.append(loss.item())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    quiet = {"report": False, "tensorboard": False, "console": False}
    with ampdiag.diagnose(out=tmp_path / "outer", **quiet) as outer:  # type: ignore[arg-type]
        step()
        with ampdiag.diagnose(out=tmp_path / "inner", **quiet) as inner:  # type: ignore[arg-type]
            step()
            step()
        step()
    assert outer.session is not None and inner.session is not None
    assert [s["loss"] for s in outer.session.steps] == losses
    assert [s["loss"] for s in inner.session.steps] == losses[1:3]


class _Checkpointed(torch.nn.Module):
    """A model whose first layer (its first trainable parameter) is recomputed in the backward
    by reentrant checkpointing: that parameter's gradient accumulates in a nested backward."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 8)
        self.last = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        hidden = checkpoint(self.first, x, use_reentrant=True)
        return self.last(torch.relu(hidden))


@pytest.mark.parametrize("collectors", [None, []], ids=["default", "no-collector"])
def test_micro_batches_whichever_way_the_backward_runs(
    quiet_diagnose: Callable[..., Any], collectors: list[Any] | None
) -> None:
    """Each step's backward passes as the loop counts them: through ``Tensor.backward``,
    ``torch.autograd.backward`` (no patched method on the way) and reentrant checkpointing;
    the same with no collector (torch's hook appends itself: no Python frame) and with the
    default ones (a collector wants each pass)."""
    torch.manual_seed(0)
    model = _Checkpointed()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plans = [["tensor"], ["autograd", "autograd"], ["tensor", "autograd", "tensor"]] * 2
    counted = []
    with quiet_diagnose(collectors=collectors, speed_probe=False) as d:
        for plan in plans:
            opt.zero_grad()
            for how in plan:
                x = torch.randn(8, 4, requires_grad=True)  # the checkpoint needs an input grad
                loss = model(x).pow(2).mean() / len(plan)
                if how == "tensor":
                    loss.backward()
                else:
                    torch.autograd.backward(loss)
            counted.append(len(plan))
            opt.step()
    assert d.session is not None
    assert [s["micro_batches"] for s in d.session.steps] == counted


@pytest.mark.parametrize("collectors", [None, []], ids=["default", "no-collector"])
def test_an_lbfgs_step_is_one_micro_batch_however_often_it_re_evaluates(
    quiet_diagnose: Callable[..., Any], collectors: list[Any] | None
) -> None:
    """LBFGS calls the closure (forward and backward) several times in one step: one batch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    calls: list[int] = []

    def closure() -> torch.Tensor:
        calls[-1] += 1
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with quiet_diagnose(collectors=collectors, speed_probe=False) as d:
        for _ in range(3):
            calls.append(0)
            opt.step(closure)
    assert all(n > 1 for n in calls)  # the pattern is exercised: re-evaluated in every step
    assert d.session is not None
    assert [s["micro_batches"] for s in d.session.steps] == [1] * len(calls)
