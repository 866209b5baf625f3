"""The CLI contract from DESIGN.md: exit codes, one-line errors, demo and report round trip."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ampdiag
from tests.advice_scan import contradictions

REPO = Path(__file__).resolve().parents[1]


def user_env() -> dict[str, str]:
    """The environment of a user's shell: this machine's PYTHONUNBUFFERED=1 would hide output
    left in a buffer when the process ends."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PYTHONUNBUFFERED", None)
    return env


def ampdiag_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = user_env()
    return subprocess.run(
        [sys.executable, "-m", "ampdiag", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,  # unblocks a hung run; a loaded machine's default demo took over 300 s
    )


def test_version() -> None:
    from ampdiag import __version__

    r = ampdiag_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ampdiag {__version__}"


@pytest.mark.parametrize(
    "args",
    [("report", "/no/such/path"), ("report",), ("nonsense",), ("demo", "--steps", "0")],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    r = ampdiag_cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampdiag: ")
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_demo_then_report_rerenders(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = ampdiag_cli("demo", "--scenario", "amp", "--out", str(out), "--steps", "6")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out / "report.html")
    assert "report:" in r.stderr  # the console summary
    session = json.loads((out / "session.json").read_text())
    # Nothing but ampdiag's summary: no Kineto "USDT ... profiler_start", no CPUAllocator line.
    # A run warning the session records (a loaded machine's 2 s step shortens the profiled
    # window) is ampdiag's own, shown as logged and as a Python warning.
    warned = session["run"]["warnings"]
    lines: list[str] = []
    source_line_next = False  # a Python warning's line is followed by its source line
    for line in r.stderr.strip().splitlines():
        if source_line_next:
            source_line_next = False
        elif any(f"Warning: ampdiag: {w}" in line for w in warned):
            source_line_next = True
        elif line not in warned:
            lines.append(line)
    assert lines[0].startswith("ampdiag: ") and all(line.startswith("  ") for line in lines[1:])
    assert session["status"] == "ok" and len(session["steps"]) == 6
    assert session["environment"]["autocast"] == "cpu:float16"
    assert session["run"]["scaler"]["class"] == "GradScaler"
    # one piece of precision advice: no two findings tell the user to train in different ones
    assert contradictions(session["findings"]) == [], [f["title"] for f in session["findings"]]
    assert list((out / "trace").glob("*.pt.trace.json.gz"))
    (out / "report.html").unlink()
    r = ampdiag_cli("report", str(out))
    assert r.returncode == 0, r.stderr
    html = (out / "report.html").read_text()
    for section in ("overview", "time", "environment"):
        assert f'<section id="{section}"' in html
    r = ampdiag_cli("report", str(out), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["schema_version"] == 1


def test_the_old_demo_dtype_command_line_still_runs_the_amp_demo(tmp_path: Path) -> None:
    """``ampdiag demo --dtype bfloat16`` (0.1.0, before --scenario): the amp demo in BF16,
    with one deprecation line on stderr naming the new form."""
    out = tmp_path / "demo"
    r = ampdiag_cli("demo", "--dtype", "bfloat16", "--out", str(out), "--steps", "2")
    assert r.returncode == 0, r.stderr
    deprecation = [line for line in r.stderr.splitlines() if "deprecated" in line]
    assert len(deprecation) == 1 and "--scenario amp --dtype bfloat16" in deprecation[0]
    session = json.loads((out / "session.json").read_text())
    assert session["environment"]["autocast"] == "cpu:bfloat16"
    assert len(session["steps"]) == 2
    # An explicit conflict stays bad input.
    r = ampdiag_cli("demo", "--scenario", "underflow", "--dtype", "bfloat16", "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_default_demo_shows_the_headline(tmp_path: Path) -> None:
    """`ampdiag demo` as a new user runs it: FP16 without a scaler, so its report shows the
    underflow (proven against an FP32 replay by scenario underflow-demo), the scale that
    fixes it, and the precision A/B measured on the model, not skipped for its budget (a
    precision slower than FP32 beyond the run's own may be left untimed, with why)."""
    out = tmp_path / "demo"
    r = ampdiag_cli("demo", "--device", "cpu", "--out", str(out))
    assert r.returncode == 0, r.stderr
    session = ampdiag.load(out)
    assert len(session.steps) == 100 and session.environment["autocast"] == "cpu:float16"
    assert session.sections["run"]["scaler"] is None  # the demo's loop uses none
    found = {f.id: f for f in session.all_findings()}
    assert found["fp16-grad-underflow"].severity == "high"
    scale = found["grad-scaler-missing"].evidence["recommended_init_scale"]
    assert scale >= 2 and math.log2(scale).is_integer()
    ab = session.sections["speed_probe"]["precisions"]
    rows = {row["precision"]: row for row in ab["results"]}
    timed = {p for p, row in rows.items() if row.get("time_ms")}
    assert {"fp32", "fp16"} <= timed, ab.get("skipped")  # FP32 against the run's own
    # BF16: its numerics always; its time unless timing it would overrun the budget, said so
    assert rows["bf16"]["loss"] is not None
    assert "bf16" in timed or "budget" in (rows["bf16"]["not_timed"] or "")
    assert f"init_scale={int(scale)}" in r.stderr  # the console prints the measured fix
    # one piece of precision advice: the underflow's fix (a scaler, or a precision with FP32's
    # range) offers no precision the lead advises against (on a CPU that emulates BF16, no
    # AVX512_BF16/AMX, the lead keeps FP32: its alternative was "train in bfloat16")
    told = [*session.findings, found["fp16-grad-underflow"]]
    assert contradictions(told) == [], [(f.id, f.fix) for f in told]


def test_report_into_unwritable_out_is_exit_2(tmp_path: Path) -> None:
    from ampdiag.session import Session

    Session().save(tmp_path / "s")
    (tmp_path / "f").write_text("x")
    r = ampdiag_cli("report", str(tmp_path / "s"), "--out", str(tmp_path / "f" / "sub"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_report_merges_the_ranks_of_a_distributed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    import ampdiag
    from ampdiag.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with ampdiag.diagnose(out=tmp_path, console=False, report=False, speed_probe=False):
            for _ in range(6):
                opt.zero_grad()
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0", "rank-1"]
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["timeline"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [Path(r["file"]).parts[-3] for r in ranks] == ["rank-0", "rank-1"]


TRACE = REPO / "tests" / "data" / "traces" / "cpu_only"


def test_report_output_is_whole_and_codes_kept_when_the_process_ends_early(
    tmp_path: Path,
) -> None:
    """``report`` ends its process without the interpreter's teardown: what it printed must
    still all arrive (a JSON larger than the pipe's buffer), and its exit codes stay."""
    trace = next(TRACE.iterdir())
    r = ampdiag_cli("report", str(trace), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the whole document, flushed before the process ended
    assert doc["timeline"]["trace_files"] == [str(trace)]
    assert r.stderr == ""
    r = ampdiag_cli("report", str(trace), "--format", "json", "--fail-on", "low")
    gated = [f for f in json.loads(r.stdout)["findings"] if f["severity"] != "info"]
    assert r.returncode == (3 if gated else 0)


def test_report_into_a_closed_pipe_exits_quietly() -> None:
    """``ampdiag report ... | head``: the reader went away; exit 0 and no 'Exception ignored'
    noise from flushing a dead pipe at exit."""
    trace = next(TRACE.iterdir())
    env = user_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampdiag", "report", str(trace), "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before anything is written: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == ""
