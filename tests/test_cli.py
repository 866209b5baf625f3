"""``ampdiag report PATH --format ... --fail-on ...``: outputs, exit codes, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ampdiag.cli import main
from ampdiag.session import Session

ROOT = Path(__file__).resolve().parents[1]


def saved(tmp_path: Path, data_share: float, name: str = "s") -> Path:
    """A session whose profile shows the given data-loading share of the step."""
    total = 100_000.0
    breakdown = {
        "share": {"forward": 1 - data_share, "data": data_share},
        "mean": {"data_us": total * data_share, "total_us": total},
        "steps": [{"step": n, "data_us": total * data_share, "total_us": total} for n in range(3)],
    }
    s = Session(
        environment={"device_type": "cuda", "device_name": "<b>GPU</b>"},
        steps=[{"index": i, "wall_s": 0.1} for i in range(3)],
        sections={"profiler": {"breakdown": breakdown, "trace_files": ["t.json"]}},
    )
    folder = tmp_path / name
    s.save(folder)
    return folder


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_the_session_document_with_fresh_findings(tmp_path, capsys) -> None:
    code, out, err = run(["report", str(saved(tmp_path, 0.75)), "--format", "json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and "profiler" in doc
    (rec,) = [f for f in doc["findings"] if f["id"] == "tune-input-pipeline"]
    assert rec["evidence"]["num_workers"] == 4 and rec["severity"] == "high"


@pytest.mark.parametrize(
    ("share", "gate", "expected"),
    [
        (0.75, "high", 3),  # data 75% -> high
        (0.15, "high", 0),  # data 15% -> medium only
        (0.15, "medium", 3),
        (0.15, "low", 3),
        (0.01, "low", 0),  # nothing found
    ],
)
def test_fail_on_gates_on_severity(tmp_path, capsys, share, gate, expected) -> None:
    folder = saved(tmp_path, share)
    code, _, err = run(["report", str(folder), "--format", "json", "--fail-on", gate], capsys)
    assert code == expected, err
    if expected == 3:
        assert f"at or above {gate}" in err and "tune-input-pipeline" in err
        assert len(err.strip().splitlines()) == 1


def test_fail_on_exit_code_from_the_real_command(tmp_path) -> None:
    folder = saved(tmp_path, 0.75)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ampdiag",
            "report",
            str(folder),
            "--format",
            "console",
            "--fail-on",
            "medium",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "tune-input-pipeline" in proc.stdout and "Traceback" not in proc.stderr


def test_console_summary(tmp_path, capsys) -> None:
    code, out, _ = run(["report", str(saved(tmp_path, 0.75)), "--format", "console"], capsys)
    assert code == 0
    assert "verdict: Data loading takes 75% of each step" in out
    assert "[  high] tune-input-pipeline" in out
    assert "explains: dataloader-bound" in out
    # The whole fix, prose wrapped and code lines whole (not only its first line).
    assert "loader = DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True," in out
    assert "persistent_workers=True, prefetch_factor=2)" in out
    # ... and the fix of the finding it merged, under it.
    assert "fix for dataloader-bound: Load batches in worker processes" in out


def test_html_in_place_and_elsewhere(tmp_path, capsys) -> None:
    folder = saved(tmp_path, 0.75)
    code, out, _ = run(["report", str(folder)], capsys)
    assert code == 0 and Path(out.strip()) == folder / "report.html"
    html = (folder / "report.html").read_text()
    assert 'id="finding-tune-input-pipeline"' in html and "&lt;b&gt;GPU&lt;/b&gt;" in html
    other = tmp_path / "other"
    code, out, _ = run(["report", str(folder / "session.json"), "--out", str(other)], capsys)
    assert code == 0 and (other / "report.html").is_file() and (other / "session.json").is_file()


def test_tensorboard_format(tmp_path, capsys) -> None:
    folder = saved(tmp_path, 0.2)
    code, _, _ = run(["report", str(folder), "--format", "tensorboard"], capsys)
    assert code == 0
    # one run, named after the output folder (tensorboard --logdir reports lists it so)
    assert list((folder / "tensorboard" / folder.name).glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["report", "/nonexistent/x"], "no such file"),
        (["report", "PLACEHOLDER", "--format", "docx"], "invalid choice"),
        (["report", "PLACEHOLDER", "--fail-on", "critical"], "invalid choice"),
        (["report"], "required"),
        (["report", "BADJSON"], "cannot read session"),
        (["report", "EMPTYDIR"], "no trace files"),
        (["report", "NOTSESSION"], "not an ampdiag session"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle) -> None:
    good = saved(tmp_path, 0.2)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "session.json").write_text("{not json")
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "session.json").write_text('{"hello": 1}')
    subst = {
        "PLACEHOLDER": str(good),
        "BADJSON": str(bad),
        "EMPTYDIR": str(empty),
        "NOTSESSION": str(foreign),
    }
    code, _, err = run([subst.get(a, a) for a in argv], capsys)
    assert code == 2
    assert needle in err and err.startswith("ampdiag: ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
