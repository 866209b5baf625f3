"""``ampdiag report`` imports what it draws: no torch for TensorBoard, no numpy for JSON.

Measured on the real command line, in a fresh interpreter: ``python -X importtime`` lists every
module the process imported, whoever imported it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ampdiag.session import Session


def imported(*argv: str, cwd: Path | None = None) -> set[str]:
    """The top-level packages ``python -X importtime -m ampdiag *argv`` imported."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ampdiag", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "ampdiag" in names and "json" in names  # the listing is really there
    return names


def test_tensorboard_report_imports_no_torch(evil_run: Session, tmp_path: Path) -> None:
    assert evil_run.path is not None
    out = tmp_path / "tb"
    names = imported("report", str(evil_run.path), "--format", "tensorboard", "--out", str(out))
    assert list((out / "tensorboard" / "tb").glob("events.out.tfevents.*"))
    assert "tensorboard" in names and "torch" not in names


def test_json_report_of_a_session_imports_no_numpy(evil_run: Session, tmp_path: Path) -> None:
    assert evil_run.path is not None
    names = imported("report", str(evil_run.path), "--format", "json", cwd=tmp_path)
    assert "numpy" not in names and "torch" not in names


def test_html_report_of_a_trace_imports_no_torch_and_no_template_engine(tmp_path: Path) -> None:
    """A trace's report is read where torch may not be, and a user waits for it: its HTML is
    built in plain Python (a template engine's import cost as much as rendering the report)."""
    trace = Path(__file__).parents[1] / "data/traces/tb_plugin_samples"
    names = imported(
        "report", str(trace / "resnet50_num_workers_0.pt.trace.json.gz"), "--out", str(tmp_path)
    )
    assert "GPU timeline" in (tmp_path / "report.html").read_text("utf-8")
    assert "markupsafe" in names
    assert not {"torch", "jinja2", "matplotlib"} & names, names
