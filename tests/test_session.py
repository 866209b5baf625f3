import json
from pathlib import Path

import pytest

from ampdiag.errors import InputError
from ampdiag.session import SCHEMA_VERSION, Finding, Session, load


def make_session() -> Session:
    return Session(
        status="error",
        error={"type": "ValueError", "message": "boom"},
        environment={"torch_version": "2.13.0", "device_type": "cpu"},
        steps=[{"index": 0, "wall_s": 0.1, "loss": 2.5, "profiled": False, "sampled": True}],
        sections={"profiler": {"trace_files": ["trace/x.pt.trace.json.gz"]}, "other": [1, 2]},
        findings=[Finding("dataloader-bound", "high", "t", {"data_share": 0.5}, "fix", "time")],
    )


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    s = make_session()
    s.save(tmp_path)
    back = load(tmp_path)
    assert back.to_dict() == s.to_dict()
    assert back.path == tmp_path
    doc = json.loads((tmp_path / "session.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["profiler"]["trace_files"] == ["trace/x.pt.trace.json.gz"]  # sections at top level
    assert doc["findings"][0]["id"] == "dataloader-bound"


def test_unknown_sections_and_fields_survive(tmp_path: Path) -> None:
    doc = make_session().to_dict()
    doc["from_the_future"] = {"x": 1}
    doc["findings"][0]["new_field"] = "ignored"
    (tmp_path / "session.json").write_text(json.dumps(doc))
    back = load(tmp_path)
    assert back.sections["from_the_future"] == {"x": 1}
    assert back.findings[0].evidence == {"data_share": 0.5}


def test_non_finite_numbers_are_valid_json(tmp_path: Path) -> None:
    s = make_session()
    s.steps[0]["loss"] = float("nan")
    s.sections["profiler"]["inf"] = float("inf")
    s.save(tmp_path)
    doc = json.loads((tmp_path / "session.json").read_text())  # strict JSON parses
    assert doc["steps"][0]["loss"] == "nan" and doc["profiler"]["inf"] == "inf"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "cannot read session"),
        ("[]", "not an ampdiag session"),
        ('{"status": "ok"}', "schema_version"),
        (json.dumps({"schema_version": SCHEMA_VERSION + 1}), "newer"),
    ],
)
def test_bad_sessions_are_input_errors(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "session.json").write_text(content)
    with pytest.raises(InputError, match=message):
        load(tmp_path)


def test_missing_session_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no session"):
        load(tmp_path / "nope")
