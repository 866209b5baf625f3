"""Hostile and awkward trace inputs (#13): any split of valid JSON, and bad input answered with
exit 2 and one line, never a traceback or exit 1."""

import json
import os

import pytest

from ampdiag.cli import main
from ampdiag.trace import lenient
from ampdiag.trace.lenient import read_lenient
from ampdiag.trace.reader import read_trace
from tests.trace.conftest import kernel, launch, records, step

# every token kind that can straddle a chunk boundary: literals, exponents, negative numbers,
# escapes (a surrogate pair), strings, nested objects, whitespace
AWKWARD = {
    "schemaVersion": 1.5e2,
    "traceName": 'a \\"quoted\\" name \ud83d\ude00 ü',
    "flags": [True, False, None, -0.0, 1e-7, 2.5e10, -3e-2, 0, 12345678901234567890],
    "traceEvents": [
        launch(1.5e1, 1),
        {**kernel(2.25e1, 3e0, 'k \ud83d\ude00 "x"', 1), "extra": [True, None, False, 1e5]},
        {"ph": "i", "name": "inst", "ts": 30, "s": "t", "args": {"x": None, "y": True}},
        step(1, 0, 1e2),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "ts": 5, "dur": 2e0},
    ],
}


def test_lenient_path_reads_any_split_of_valid_json(tmp_path, monkeypatch):
    path = tmp_path / "awkward.json"
    # escapes (a surrogate pair) and a raw two-byte character, both cut by the boundaries
    text = json.dumps(AWKWARD, indent=1).replace("\\u00fc", "ü")
    path.write_text(text, encoding="utf-8")
    expected = records(read_trace(path))
    assert expected[0]  # the kernel was read
    for chunk in range(1, 80):  # every boundary position falls inside every kind of token
        monkeypatch.setattr(lenient, "CHUNK_CHARS", chunk)
        assert records(read_lenient(path)) == expected, chunk


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("deep nesting", b'{"traceEvents": [' + b"[" * 100000 + b"]" * 100000 + b"]}"),
        ("deep in an event", b'{"traceEvents": [{"a": ' + b"[" * 9**6 + b"]" * 9**6 + b"}]}"),
        (
            "a 5000-digit step number",
            json.dumps({"traceEvents": [step(1, 0, 10)]}).replace("#1", "#" + "7" * 5000).encode(),
        ),
        ("a huge int", b'{"traceEvents": [{"ph": "X", "ts": ' + b"9" * 5000 + b', "dur": 1}]}'),
        ("a huge int elsewhere", b'{"x": ' + b"9" * 5000 + b', "traceEvents": []}'),
    ],
)
def test_bad_traces_exit_2_with_one_line(tmp_path, capsys, name, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    code = main(["report", str(path), "--format", "json"])
    err = capsys.readouterr().err
    assert code in (0, 2), (name, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("ampdiag: "), (name, err)


def test_a_5000_digit_step_number_is_not_a_step(tmp_path):
    events = [step(1, 0, 10), {**step(2, 20, 10), "name": "ProfilerStep#" + "7" * 5000}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert [s[0] for s in read_trace(path).steps] == [1]


def test_unlistable_folder_and_unreadable_rank_folder_exit_2(tmp_path, capsys, monkeypatch):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
        (tmp_path / f"rank{rank}" / "t.json").write_text(
            json.dumps({"traceEvents": [launch(1, 1), kernel(2, 3, "k", 1)]})
        )
    denied = {str(tmp_path / "rank1")}
    scandir = os.scandir

    def no_permission(path="."):  # as chmod 0 does for a user other than root
        if str(path) in denied:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", no_permission)
    assert main(["report", str(tmp_path), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert "rank1" in err and "Permission denied" in err and err.count("\n") == 1
    denied = {str(tmp_path)}
    assert main(["report", str(tmp_path), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and err.count("\n") == 1
