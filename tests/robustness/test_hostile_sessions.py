"""A session.json or snapshot that lies about its types: exit 2 naming the key, before analysis.

Truth: the documents are made by hand (a real session with one value swapped for a value of
another type), so what is wrong, and where, is known without ampdiag. The CLI cases run under
the limits of `test_hostile_inputs` (1 GiB address space, 10 s); the swap sweep runs loading
and analysis in-process: either loading refuses the document naming the key it changed, or the
analysis runs every rule without one failing (no ``analysis-error``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ampdiag
from ampdiag.analysis import analyze
from ampdiag.errors import InputError
from ampdiag.session import Session
from tests.robustness.test_hostile_inputs import assert_answered, write_pickle


def session_folder(tmp_path: Path, **changes: Any) -> Path:
    doc: dict[str, Any] = {"schema_version": 1, "status": "ok", "environment": {}, "steps": []}
    doc.update(changes)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "session.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"status": "error", "error": "boom"}, "error"),
        ({"status": "error", "error": {"type": 5}}, "error.type"),
        ({"findings": [{"x": 1}]}, "findings[0].id"),
        ({"findings": ["garbage"]}, "findings[0]"),
        ({"findings": [{"id": "a", "severity": "dire", "title": "t"}]}, "findings[0].severity"),
        (
            {"findings": [{"id": "a", "severity": "high", "title": "t", "evidence": 3}]},
            "findings[0].evidence",
        ),
        ({"findings": {"id": "a"}}, "findings"),
        ({"created": 5}, "created"),
    ],
    ids=[
        "error-text",
        "error-type",
        "finding-keys",
        "finding-text",
        "severity",
        "evidence",
        "findings-object",
        "created",
    ],
)
def test_a_session_of_the_wrong_types_is_one_line_naming_the_key(
    tmp_path: Path, changes: dict[str, Any], key: str
) -> None:
    proc = assert_answered(session_folder(tmp_path, **changes))
    assert f" {key}:" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("snap", "key"),
    [
        ({"segments": [{"total_size": 10**5000}], "device_traces": []}, "segments[0].total_size"),
        (
            {"segments": [], "device_traces": [[{"action": "alloc", "size": 2**70}]]},
            "device_traces[0][0].size",
        ),
        ({"segments": [{"blocks": [{"size": -(10**30)}]}]}, "segments[0].blocks[0].size"),
        ({"segments": [{"blocks": [{"size": "12"}]}]}, "segments[0].blocks[0].size"),
        ({"segments": [1]}, "segments[0]"),
    ],
    ids=["huge-total", "huge-trace-size", "negative", "text-size", "not-an-object"],
)
def test_a_snapshot_of_the_wrong_types_is_one_line_naming_the_key(
    tmp_path: Path, snap: dict[str, Any], key: str
) -> None:
    proc = assert_answered(write_pickle(tmp_path / "snapshot.pickle", snap))
    assert f" {key}:" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def real_document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session.json of a short real run (an error in its block: ``error`` filled)."""
    out = tmp_path_factory.mktemp("real")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = {"console": False, "report": False, "tensorboard": False}
    with pytest.raises(ValueError), ampdiag.diagnose(out=out, **settings):  # type: ignore[arg-type]
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            loss.backward()
            opt.step()
        raise ValueError("the user's")
    doc: dict[str, Any] = json.loads((out / "session.json").read_text())
    return doc


WRONG = ("text", [1, "x"], {"k": 1}, None, 10**30, -1.5, True)


def swaps(doc: dict[str, Any]) -> Iterator[tuple[str, list[Any], Any]]:
    """(where, path, wrong value) for every object key two levels deep and each list's first."""
    for key, value in doc.items():
        if key == "schema_version":
            continue
        for wrong in WRONG:
            if type(wrong) is not type(value):
                yield key, [key], wrong
        items = value.items() if isinstance(value, dict) else []
        for sub, inner in items:
            for wrong in WRONG:
                if type(wrong) is not type(inner):
                    yield f"{key}.{sub}", [key, sub], wrong
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for sub, inner in value[0].items():
                for wrong in WRONG:
                    if type(wrong) is not type(inner):
                        yield f"{key}[0].{sub}", [key, 0, sub], wrong


def test_every_swapped_value_is_refused_naming_it_or_analysed_without_a_rule_failing(
    real_document: dict[str, Any],
) -> None:
    assert real_document["error"]["type"] == "ValueError"
    failures = []
    count = 0
    for where, path, wrong in swaps(real_document):
        doc = copy.deepcopy(real_document)
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = wrong
        count += 1
        try:
            session = Session.from_dict(doc)
        except InputError as exc:
            if where.split(".")[0].split("[")[0] not in str(exc):
                failures.append(f"{where}={wrong!r}: refused without naming it: {exc}")
            continue
        try:
            findings = analyze(session)
        except Exception as exc:
            failures.append(f"{where}={wrong!r}: analysis raised {exc!r}")
            continue
        broken = [f.evidence for f in findings if f.id == "analysis-error"]
        if broken:
            failures.append(f"{where}={wrong!r}: {broken}")
    assert count > 200, count
    assert not failures, f"{len(failures)} of {count}:\n" + "\n".join(failures[:40])
