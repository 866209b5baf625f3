"""`ampdiag report` on a snapshot pickle never runs code from it."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from ampdiag.cli import main
from ampdiag.errors import InputError
from ampdiag.sources.safe_pickle import load_plain, loads_plain

FIXTURE = Path(__file__).parent.parent / "data" / "cuda" / "snapshot_documented_format.json"
ROOT = Path(__file__).resolve().parents[2]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def evil_pickle(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Evil(marker)]]}))
    return path, marker


def test_plain_data_round_trips() -> None:
    data = {"a": [1, 2.5, "x", None, True, (1, 2)], "b": {"c": b"bytes"}}
    assert loads_plain(pickle.dumps(data)) == data


def test_malicious_pickle_is_refused_and_not_run(tmp_path: Path) -> None:
    path, marker = evil_pickle(tmp_path)
    # the standard unpickler would run it (proves the payload is real)
    probe_marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Evil(probe_marker)))
    assert probe_marker.exists()
    with pytest.raises(InputError, match=r"references (posix|nt|os)\.system"):
        load_plain(path)
    assert not marker.exists()


def test_cli_refuses_with_one_line_exit_2(tmp_path: Path) -> None:
    path, marker = evil_pickle(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "ampdiag", "report", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampdiag: snapshot.pickle: refusing")
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_cli_reports_a_real_snapshot_pickle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(json.loads(FIXTURE.read_text())))
    assert main(["report", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ids = {f["id"] for f in doc["findings"]}
    assert {"allocator-fragmentation", "out-of-memory"} <= ids
    assert main(["report", str(path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "Top allocation sites at the peak" in html
    assert "<script>alert(1)</script>" not in html  # frame names are escaped
