"""Why nothing was profiled, in the right words: no step boundary, no training, or too short.

Truth, from the loop itself: how many backward passes and optimizer steps it ran.
"""

from __future__ import annotations

from pathlib import Path

import torch

import ampdiag

QUIET = {"console": False, "report": False, "tensorboard": False, "speed_probe": False}


def _ids(d: ampdiag.Diagnosis) -> list[str]:
    assert d.session is not None
    return [f.id for f in d.session.findings]


def test_hand_written_sgd_says_no_step_boundary_was_seen(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    iterations = 20
    with ampdiag.diagnose(out=tmp_path / "run", **QUIET) as d:
        for _ in range(iterations):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            with torch.no_grad():  # no optimizer: the parameters updated by hand
                for p in model.parameters():
                    assert p.grad is not None
                    p -= 0.01 * p.grad
                    p.grad = None
    ids = _ids(d)
    assert "no-step-boundary" in ids and "profiler-no-steps" not in ids
    f = next(f for f in d.session.findings if f.id == "no-step-boundary")  # type: ignore[union-attr]
    assert f.evidence["backward_calls"] == iterations
    assert "d.step()" in f.fix


def test_marking_steps_by_hand_profiles_them(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 1)
    with ampdiag.diagnose(out=tmp_path / "run", **QUIET) as d:
        for _ in range(6):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            d.step()
    ids = _ids(d)
    assert "no-step-boundary" not in ids and "profiler-no-steps" not in ids
    assert d.session is not None and d.session.sections["profiler"]["recorded_steps"]


def test_a_block_that_trains_nothing_says_so(tmp_path: Path) -> None:
    with ampdiag.diagnose(out=tmp_path / "run", **QUIET) as d:
        torch.nn.Linear(8, 1)  # built, never trained (a script run with --help)
    ids = _ids(d)
    assert ids == ["nothing-measured"]  # the verdict, high: a --fail-on gate fails on it


def test_a_short_run_still_says_it_was_shorter_than_the_warm_up(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampdiag.diagnose(out=tmp_path / "run", **QUIET) as d:
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    ids = _ids(d)
    assert "profiler-no-steps" in ids and "no-step-boundary" not in ids
    assert "nothing-measured" not in ids


FAILING = """
import torch

def train():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        if step == 2:
            raise ValueError("boom at step 2")

train()
"""


def test_a_failing_scripts_traceback_comes_first_without_ampdiags_frames(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "fails.py"
    script.write_text(FAILING)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ampdiag", "run", "--out", str(tmp_path / "run"),
           "--no-speed-probe", "--no-tensorboard", str(script)]  # fmt: skip
    got = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, check=False)  # fmt: skip
    assert got.returncode == plain.returncode == 1
    err = got.stderr
    assert err.startswith("Traceback (most recent call last):"), err[:500]
    assert err.index("ValueError: boom at step 2") < err.index("ampdiag: ")  # before the summary
    tb = err[: err.index("ValueError: boom at step 2")]
    assert "ampdiag" not in tb and "runpy" not in tb
    # the same frames python shows for the plain run
    assert [ln for ln in tb.splitlines() if ln.startswith("  File")] == [
        ln for ln in plain.stderr.splitlines() if ln.startswith("  File")
    ]
