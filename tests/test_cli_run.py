"""``ampdiag run SCRIPT [ARGS...]``: an unmodified script under diagnose(), like ``python SCRIPT``.

Truth: the script records what it saw itself (its ``sys.argv``, ``__name__``, the steps it
ran); the same loop under the context manager gives the session the command must match.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ampdiag
from ampdiag.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--no-report", "--no-tensorboard", "--no-console", "--no-speed-probe", "--no-memory"]

SCRIPT = """
import json, os, signal, sys
import torch

def train(steps, fail_at=None, how=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if step == fail_at:
            if how == "error":
                raise ValueError("boom at step %d" % step)
            if how == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
            if how == "exit":
                sys.exit(int(os.environ.get("EXIT_CODE", "0")))
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        loss.backward()
        opt.step()
    return steps

if __name__ == "__main__":
    record, steps, fail_at, how = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    with open(record, "w") as fh:
        json.dump({"argv": sys.argv, "name": __name__}, fh)
    train(steps, None if fail_at == "-" else int(fail_at), how)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _session(out: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((out / "session.json").read_text())
    return data


def test_python_m_ampdiag_run_a_plain_loop(tmp_path: Path, script: Path) -> None:
    out, record = tmp_path / "out", tmp_path / "record.json"
    args = [str(record), "3", "-", "none", "--lr", "0.1"]  # "--lr": the script's, not ours
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ampdiag",
            "run",
            "--out",
            str(out),
            *QUIET,
            "--profile-active",
            "1",
            str(script),
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(record.read_text())
    assert seen == {"argv": [str(script), *args], "name": "__main__"}
    session = _session(out)
    assert session["status"] == "ok"
    assert len(session["steps"]) == 3  # type: ignore[arg-type]
    assert session["config"]["profile_active"] == 1  # type: ignore[index]
    assert session["run"]["autocast_seen"] == {"cpu:bfloat16": 3}  # type: ignore[index]
    assert sys.argv[0] != str(script)


def _in_process(tmp_path: Path, script: Path, fail_at: str, how: str) -> tuple[int, Path]:
    out = tmp_path / f"out-{how}"
    argv_before, path_before = list(sys.argv), list(sys.path)
    code = main(
        ["run", "--out", str(out), *QUIET, str(script), str(tmp_path / "r.json"), "4", fail_at, how]
    )
    assert sys.argv == argv_before and sys.path == path_before  # put back
    return code, out


def _with_context_manager(
    tmp_path: Path, script: Path, fail_at: int, how: str
) -> dict[str, object]:
    # The same loop in this process under diagnose(): the session the command must match.
    namespace: dict[str, object] = {"__name__": "not_main"}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    out = tmp_path / f"cm-{how}"
    expected = ValueError if how == "error" else KeyboardInterrupt
    with (
        pytest.raises(expected),
        ampdiag.diagnose(
            out=out, report=False, tensorboard=False, console=False, speed_probe=False, memory=False
        ),
    ):
        namespace["train"](4, fail_at, how)  # type: ignore[operator]
    return _session(out)


@pytest.mark.parametrize(
    ("how", "code", "status"), [("error", 1, "error"), ("sigint", 130, "interrupted")]
)
def test_an_error_or_ctrl_c_leaves_the_same_session_as_the_context_manager(
    tmp_path: Path,
    script: Path,
    capsys: pytest.CaptureFixture[str],
    how: str,
    code: int,
    status: str,
) -> None:
    got, out = _in_process(tmp_path, script, "2", how)
    err = capsys.readouterr().err
    assert got == code
    if how == "error":
        assert "ValueError: boom at step 2" in err and "Traceback" in err
    else:  # Ctrl-C: python prints where the script stopped; so does ampdiag run, first
        assert "Traceback" in err and "KeyboardInterrupt" in err
        assert "os.kill(os.getpid(), signal.SIGINT)" in err
        assert err.index("KeyboardInterrupt") < err.index("ampdiag: the script was interrupted")
    session = _session(out)
    reference = _with_context_manager(tmp_path, script, 2, how)
    assert session["status"] == reference["status"] == status
    assert len(session["steps"]) == len(reference["steps"]) == 2  # type: ignore[arg-type]
    assert session["error"]["type"] == reference["error"]["type"]  # type: ignore[index]
    assert (out / "report.html").exists() is False  # --no-report was respected


@pytest.mark.parametrize(("exit_code", "status"), [(0, "ok"), (3, "error")])
def test_sys_exit_is_the_exit_code(
    tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch, exit_code: int, status: str
) -> None:
    monkeypatch.setenv("EXIT_CODE", str(exit_code))
    got, out = _in_process(tmp_path, script, "1", "exit")
    assert got == exit_code
    assert _session(out)["status"] == status


def test_a_missing_script_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    assert capsys.readouterr().err.strip().startswith("ampdiag: no such script")


def test_every_setting_is_a_flag_with_its_documentation() -> None:
    """``ampdiag run --help`` explains each DiagnoseConfig field with config.py's own words."""
    from dataclasses import fields

    from ampdiag.cli import build_parser
    from ampdiag.config import DiagnoseConfig

    (run,) = [
        a.choices["run"]
        for a in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        if getattr(a, "choices", None) and "run" in a.choices
    ]
    flags = {o: a for a in run._actions for o in a.option_strings}
    doc = DiagnoseConfig.__doc__ or ""
    for f in fields(DiagnoseConfig):
        action = flags["--" + f.name.replace("_", "-")]
        assert action.dest == f.name
        words = (action.help or "").split()
        # the help opens with the field's first documented words, as the docstring has them
        opening = " ".join(words[:4]).replace("``", "")
        assert len(words) >= 3 and opening in " ".join(doc.replace("``", "").split()), f.name


def test_float_settings_are_flags_and_reach_the_session(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "run"
    code = main(
        ["run", "--out", str(out), *QUIET, "--profile-long-step-s", "0.25",
         "--precision-ab-budget-s", "0", str(script), str(tmp_path / "rec.json"), "3", "-", "-"]
    )  # fmt: skip
    assert code == 0
    config = json.loads((out / "session.json").read_text())["config"]
    assert config["profile_long_step_s"] == 0.25 and config["precision_ab_budget_s"] == 0.0
