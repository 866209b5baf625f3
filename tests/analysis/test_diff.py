"""ampdiag.diff / `ampdiag diff`: a before/after comparison of two real runs.

The truth here is each session's own JSON, read directly (not through ampdiag's readers), and
the fault the fix removed: FP16 autocast without a GradScaler, then with one.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.cli import main

pytestmark = pytest.mark.slow


def _train(out: Path, use_scaler: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu") if use_scaler else None
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with ampdiag.diagnose(
        out=out, speed_probe=False, console=False, tensorboard=False, profile_active=2
    ):
        for _ in range(6):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("diff")
    before, after = root / "no-scaler", root / "scaler"
    _train(before, use_scaler=False)
    _train(after, use_scaler=True)
    return before, after


def _doc(folder: Path) -> dict:
    return json.loads((folder / "session.json").read_text())


def _ids(doc: dict) -> set[str]:
    ids = set()
    for f in doc["findings"]:
        ids.add(f["id"])
        ids.update(m["id"] for m in f["evidence"].get("merged") or [])
    return ids


@pytest.mark.slow
def test_the_diff_numbers_are_the_sessions_own(runs: tuple[Path, Path]) -> None:
    before, after = runs
    d = ampdiag.diff(before, after)
    assert (d.before_label, d.after_label) == ("no-scaler", "scaler")
    for folder, side in ((before, "before"), (after, "after")):
        doc = _doc(folder)
        walls = [s["wall_s"] for s in doc["steps"]][1:]
        assert getattr(d.metric("step_time_s"), side) == pytest.approx(statistics.median(walls))
        assert getattr(d.metric("memory_peak_bytes"), side) == doc["memory"]["peak"]["bytes"]
        losses = [s["loss"] for s in doc["steps"]]
        assert getattr(d.metric("final_loss"), side) == pytest.approx(losses[-1])
    # no scaler in A: its skipped-steps figure is "not measured", never 0
    assert d.metric("skipped_steps").before is None
    assert d.metric("skipped_steps").after == len(_doc(after)["scaler"]["skipped_steps"])


@pytest.mark.slow
def test_a_finding_the_fix_removed_shows_as_resolved(runs: tuple[Path, Path]) -> None:
    before, after = runs
    a, b = _ids(_doc(before)), _ids(_doc(after))
    assert "grad-scaler-missing" in a and "grad-scaler-missing" not in b
    d = ampdiag.diff(before, after)
    assert "grad-scaler-missing" in {f.id for f in d.resolved}
    assert {f.id for f in d.resolved} == a - b
    assert {f.id for f in d.new} == b - a
    assert {f.id for f in d.unchanged} == a & b


@pytest.mark.slow
def test_cli_diff_formats(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = runs
    assert main(["diff", str(before), str(after), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "grad-scaler-missing" in [f["id"] for f in doc["findings"]["resolved"]]
    assert main(["diff", str(before), str(after)]) == 0
    text = capsys.readouterr().out
    assert "resolved" in text and "grad-scaler-missing" in text
    out = tmp_path / "cmp"
    assert main(["diff", str(before), str(after), "--format", "html", "--out", str(out)]) == 0
    page = (out / "diff.html").read_text()
    assert "grad-scaler-missing" in page and "Content-Security-Policy" in page
    # both runs land as separate runs in one TensorBoard logdir
    for run in ("no-scaler", "scaler"):
        assert list((out / "tensorboard" / run).glob("events.out.tfevents.*"))


def test_cli_diff_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path / "nope"), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ampdiag:")


@pytest.mark.slow
def test_session_shows_inline_in_a_notebook(runs: tuple[Path, Path]) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    # IPython's own display machinery, as a notebook cell shows a value: the data classes
    # have no _repr_html_, the formatters registered by type name at `import ampdiag` draw them.
    shell = InteractiveShell.instance()
    ampdiag._register_notebook_display()
    session = ampdiag.load(runs[0])
    shown, _ = shell.display_formatter.format(session)
    page = shown["text/html"]
    assert page.startswith("<iframe srcdoc=") and " sandbox " in page
    # the report is inside, escaped, with its policy that forbids the network
    assert "Content-Security-Policy" in page and "<html" not in page.split('"', 2)[1][:20]
    assert "grad-scaler-missing" in page
    text = shown["text/plain"]
    assert text.startswith("ampdiag:") and "grad-scaler-missing" in text
    diffed, _ = shell.display_formatter.format(ampdiag.diff(*runs))
    assert "Resolved findings" in diffed["text/html"]
    assert session.findings[0].id in repr(session)  # the short form names the findings


def _timed(walls: list[float]) -> ampdiag.Session:
    return ampdiag.Session(steps=[{"index": i, "wall_s": w} for i, w in enumerate(walls)])


def test_a_timing_inside_the_runs_noise_is_not_a_change() -> None:
    noisy = [9.0, 1.0, 1.2, 0.8, 1.1, 0.9]  # step 0 pays for lazy initialization
    same = ampdiag.diff(_timed(noisy), _timed([9.0, 1.05, 1.25, 0.85, 1.15, 0.95]))
    assert same.metric("step_time_s").verdict == "same"
    slower = ampdiag.diff(_timed(noisy), _timed([9.0, 2.0, 2.2, 1.8, 2.1, 1.9]))
    change = slower.metric("step_time_s")
    assert change.before == pytest.approx(1.0) and change.after == pytest.approx(2.0)
    assert change.verdict == "worse"
    assert ampdiag.diff(_timed(noisy), _timed(noisy)).metric("memory_peak_bytes").verdict == (
        "not measured"
    )
