"""A session that measured nothing never reads as healthy, and a ``--fail-on`` gate fails on it.

The truth is what each test did itself: how many steps its loop ran and updated with an
optimizer, or what it wrote into a hand-made ``session.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.cli import main
from tests.conftest import REPO, TinyNet

QUIET = {"console": False, "report": False, "tensorboard": False, "speed_probe": False}
HEALTHY = "No problem above the documented thresholds was found"


def gate(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["report", str(folder), "--format", "console", "--fail-on", "high"])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_near_empty_session_is_not_healthy(tmp_path, capsys) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "session.json").write_text(json.dumps({"schema_version": 1, "status": "ok"}))
    code, out, err = gate(folder, capsys)
    assert code == 3, (out, err)
    assert HEALTHY not in out and "no measurement" in out
    assert "nothing-measured" in err


def test_a_block_that_trained_no_step_says_so(tmp_path, capsys) -> None:
    model = TinyNet()
    with ampdiag.diagnose(out=tmp_path / "r", **QUIET) as d:
        model(torch.randn(2, 16))  # a (training) forward, and no backward or step
    (f,) = [f for f in d.session.findings if f.id == "nothing-measured"]
    assert f.severity == "high" and f.evidence["steps"] == 0
    assert f.evidence["models_seen"] == 1 and f.evidence["optimizers_seen"] == 0
    assert d.session.findings[0].id == "nothing-measured"  # the verdict names it
    code, out, _ = gate(d.out, capsys)
    assert code == 3 and "No training step was recorded" in out and HEALTHY not in out


def test_a_run_that_trained_gets_no_such_finding(tmp_path) -> None:
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampdiag.diagnose(out=tmp_path / "r", **QUIET) as d:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.zeros(8).long()).backward()
            opt.step()
    assert len(d.session.steps) == 3
    assert "nothing-measured" not in {f.id for f in d.session.findings}


def test_a_trace_is_measured_by_its_timeline(tmp_path) -> None:
    trace = REPO / "tests/data/traces/triton_example/triton_example.json.gz"
    proc = subprocess.run(
        [sys.executable, "-m", "ampdiag", "report", str(trace), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["timeline"]  # the trace's kernels were read ...
    assert "nothing-measured" not in {f["id"] for f in doc["findings"]}  # ... so it measured


def test_a_session_that_is_not_utf8_is_bad_input(tmp_path, capsys) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "session.json").write_bytes(b'{"schema_version": 1, "x": "\xff\xfe"}')
    code = main(["report", str(folder), "--format", "json"])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("ampdiag: ") and "utf-8" in err.lower()
    assert len(err.strip().splitlines()) == 1
