"""Reading a folder of ranks with worker processes gives what reading the files one by one does."""

import os
import shutil

import pytest

from ampdiag.errors import InputError
from ampdiag.sources.traces import session_from_traces, trace_files
from ampdiag.trace import parallel as P
from ampdiag.trace import parallel_files as PF
from ampdiag.trace import reader as R
from tests.trace.conftest import manifest, no_children_left
from tests.trace.conftest import records as _records

pytest.importorskip("msgspec")
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture
def rank_folder(traces, tmp_path):
    """Every real Kineto trace but the largest, as the files of one folder."""
    for row in manifest(traces):
        if row["events"] == "0" or int(row["json_bytes"]) > 20_000_000:
            continue
        src = traces / row["path"]
        shutil.copy(src, tmp_path / f"{src.parent.name}-{src.name}")
    return tmp_path


def _one_by_one(files):
    return [R.read_trace(f, i) for i, f in enumerate(files)]


def test_a_folder_reads_the_same_with_workers(rank_folder, monkeypatch):
    files = trace_files(rank_folder)
    assert len(files) >= 6
    monkeypatch.setenv(P.ENV_WORKERS, "1")
    expected = [_records(rt) for rt in _one_by_one(files)]
    for workers in ("2", "3"):
        monkeypatch.setenv(P.ENV_WORKERS, workers)
        assert PF.workers_for(files) == int(workers)
        got = list(R.read_traces(files))
        assert [rt.path for rt in got] == files  # in file order
        assert [_records(rt) for rt in got] == expected
        assert all(rt.reader == "fast" and len(rt.worker_peak_bytes) == 1 for rt in got)
        no_children_left()


def test_sessions_of_a_folder_agree(rank_folder, monkeypatch):
    monkeypatch.setenv(P.ENV_WORKERS, "1")
    alone = session_from_traces(rank_folder).sections["timeline"]["ranks"]
    monkeypatch.setenv(P.ENV_WORKERS, "2")
    assert session_from_traces(rank_folder).sections["timeline"]["ranks"] == alone


def test_a_file_the_fast_path_refuses_is_read_here(rank_folder, monkeypatch):
    odd = rank_folder / "odd.json"
    odd.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -1}]}'
    )
    files = trace_files(rank_folder)
    monkeypatch.setenv(P.ENV_WORKERS, "2")
    got = list(R.read_traces(files))
    i = files.index(odd)
    assert got[i].reader == "stdlib" and got[i].skipped == {"negative duration": 1}
    assert [rt.reader for j, rt in enumerate(got) if j != i] == ["fast"] * (len(files) - 1)
    no_children_left()


def test_a_bad_file_gives_its_error_and_leaves_no_worker(rank_folder, monkeypatch):
    (rank_folder / "broken.json").write_text('{"traceEvents": [')
    files = trace_files(rank_folder)
    monkeypatch.setenv(P.ENV_WORKERS, "1")
    with pytest.raises(InputError) as alone:
        _one_by_one(files)
    monkeypatch.setenv(P.ENV_WORKERS, "3")
    with pytest.raises(InputError) as many:
        list(R.read_traces(files))
    assert str(many.value) == str(alone.value)
    no_children_left()


def test_a_dead_worker_leaves_its_files_to_this_process(rank_folder, monkeypatch):
    files = trace_files(rank_folder)
    monkeypatch.setenv(P.ENV_WORKERS, "1")
    expected = [_records(rt) for rt in _one_by_one(files)]
    monkeypatch.setenv(P.ENV_WORKERS, "2")
    real = P.read_part_outcome
    calls = []

    def dies_on_its_second_file(path, *args):
        calls.append(path)
        if len(calls) == 2:
            os._exit(3)
        return real(path, *args)

    monkeypatch.setattr(P, "read_part_outcome", dies_on_its_second_file)
    got = list(R.read_traces(files))
    assert [_records(rt) for rt in got] == expected
    # each worker died on its second file; this process read those (split in two parts itself,
    # AMPDIAG_TRACE_WORKERS=2 asking for two processes a file), the pool's files are whole
    assert sorted({rt.processes for rt in got}) == [1, 2]
    no_children_left()


def test_stopping_early_stops_the_workers(rank_folder, monkeypatch):
    monkeypatch.setenv(P.ENV_WORKERS, "2")
    files = trace_files(rank_folder)
    it = R.read_traces(files)
    next(it)
    it.close()
    no_children_left()
