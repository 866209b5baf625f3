"""``ampdiag run --steps A:B SCRIPT``: a window of an unmodified script's steps, via the CLI.

Truth: the script records each step's loss itself and saves its final parameters; the same
script run with plain ``python`` gives the parameters the diagnosed run must match bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--no-report", "--no-tensorboard", "--no-console", "--no-speed-probe"]

SCRIPT = """
import json, sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for step in range(int(sys.argv[2])):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(4, 8)).float().pow(2).mean()
    losses.append(loss.item())
    loss.backward()
    opt.step()
torch.save(model.state_dict(), sys.argv[1] + ".pt")
with open(sys.argv[1], "w") as fh:
    json.dump(losses, fh)
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_ampdiag_run_steps_diagnoses_the_window_of_a_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain, diagnosed, out = tmp_path / "plain.json", tmp_path / "diag.json", tmp_path / "out"
    assert _run(str(script), str(plain), "12").returncode == 0
    proc = _run(
        "-m", "ampdiag", "run", "--out", str(out), *QUIET, "--steps", "4:8",
        str(script), str(diagnosed), "12",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # Bit-identical: the script's own parameters and losses, with and without ampdiag.
    before, after = torch.load(f"{plain}.pt"), torch.load(f"{diagnosed}.pt")
    assert all(torch.equal(before[k], after[k]) for k in before)
    losses = json.loads(diagnosed.read_text())
    assert losses == json.loads(plain.read_text()) and len(losses) == 12
    session = json.loads((out / "session.json").read_text())
    assert session["status"] == "ok" and session["config"]["steps"] == [4, 8]
    assert [s["index"] for s in session["steps"]] == [4, 5, 6, 7]
    assert [s["loss"] for s in session["steps"]] == [
        float(torch.tensor(v, dtype=torch.float32)) for v in losses[4:8]
    ]
    # Analysed over the window: its 4 forwards, each under the script's BF16 autocast, and the
    # dtype audit on one of its steps (a healthy run may well have no finding at all).
    assert session["run"]["autocast_seen"] == {"cpu:bfloat16": 4}
    assert session["precision"]["audited"] and 4 <= session["precision"]["step"] < 8


def test_ampdiag_run_rejects_a_bad_window_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for flag in (["--steps", "8:4"], ["--steps", "4"], ["--trigger", "loss-drop"]):
        proc = _run("-m", "ampdiag", "run", *flag, str(script), str(tmp_path / "x.json"), "2")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "x.json").exists()
