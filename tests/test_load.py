"""``ampdiag.load(path)``: the one public way to open anything ``ampdiag report`` reads."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

import ampdiag
from ampdiag.session import Session
from tests.distributed.synthetic import rank_traces

DATA = Path(__file__).parent / "data"
MiB = 1024**2


def test_a_saved_session_folder_and_its_file(tmp_path: Path) -> None:
    steps = [{"index": i, "wall_s": 0.5 + i} for i in range(3)]
    Session(steps=steps).save(tmp_path)  # type: ignore[arg-type]
    for path in (tmp_path, tmp_path / "session.json", str(tmp_path)):
        assert ampdiag.load(path).steps == steps


def test_a_folder_of_ranks_traces_and_one_trace_file(tmp_path: Path) -> None:
    rank_traces(tmp_path, None)  # two ranks, written here: rank-0.json and rank-1.json
    ranks = ampdiag.load(tmp_path).section("timeline")["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    one = ampdiag.load(tmp_path / "rank-1.json").section("timeline")["ranks"]
    assert [r["rank"] for r in one] == [1]


def test_a_cuda_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    doc = json.loads((DATA / "cuda" / "snapshot_documented_format.json").read_text())
    path.write_bytes(pickle.dumps(doc))
    cuda = ampdiag.load(path).section("memory")["cuda"]
    # the fixture's segments: 2048 MiB reserved, 1152 MiB allocated at the peak
    assert cuda["peak"]["fragmentation_bytes"] == (2048 - 1152) * MiB


def test_nothing_there_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(ampdiag.InputError, match="no such file or folder"):
        ampdiag.load(tmp_path / "nope")
