"""Reading one file with several processes gives exactly the records of one reader."""

import gzip
import json
import os
import sys
import threading

import pytest

from ampdiag.analysis.timeline import analyze_rank
from ampdiag.trace import fastread as F
from ampdiag.trace import parallel as P
from ampdiag.trace import reader as R
from tests.trace.conftest import kernel, launch, manifest, no_children_left, step, write_trace
from tests.trace.conftest import records as _records

pytest.importorskip("msgspec")
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _read(path, monkeypatch, workers):
    monkeypatch.setenv(P.ENV_WORKERS, str(workers))
    return F.read_fast(path)


@pytest.mark.slow
def test_every_real_trace_reads_the_same_with_several_processes(traces, monkeypatch):
    for row in manifest(traces):
        if row["events"] == "0":
            continue
        path = traces / row["path"]
        one = _read(path, monkeypatch, 1)
        assert one.processes == 1
        for workers in (2, 3, 5):
            many = _read(path, monkeypatch, workers)
            assert many.processes == workers, row["path"]
            assert len(many.worker_peak_bytes) == workers - 1
            assert _records(many) == _records(one), (row["path"], workers)
            # GPU activities in the same order (not only the same set), so the same analysis
            assert many.gpu == one.gpu
            assert list(many.cpu_ops) == list(one.cpu_ops)
            assert analyze_rank(many) == analyze_rank(one)


def test_parts_split_inside_small_buffers(traces, monkeypatch):
    """Part boundaries land anywhere relative to the buffers: each event is read once."""
    src = traces / "trace_filter/sampled_rank-0.json.gz"
    one = _read(src, monkeypatch, 1)
    monkeypatch.setattr(F, "CHUNK_BYTES", 97)
    for workers in (2, 4, 7):
        assert _records(_read(src, monkeypatch, workers)) == _records(one)


def test_a_part_that_needs_the_general_reader_sends_the_whole_file_there(tmp_path, monkeypatch):
    events = [launch(i, i) for i in range(1, 400)] + [kernel(i, 1, "k", i) for i in range(1, 400)]
    events += [step(1, 0, 1000)]
    events[-2]["dur"] = -1  # near the end of the file: in the last worker's part
    path = write_trace(tmp_path / "odd.json", events)
    monkeypatch.setenv(P.ENV_WORKERS, "3")
    with pytest.raises(F.Fallback):
        F.read_fast(path)
    rt = R.read_trace(path)
    assert rt.reader == "stdlib" and rt.skipped == {"negative duration": 1}
    assert _records(rt) == _records(R.read_trace_stdlib(path))


def test_a_worker_that_dies_leaves_the_file_to_this_process(traces, monkeypatch):
    src = traces / "trace_filter/sampled_rank-0.json.gz"
    expected = _records(_read(src, monkeypatch, 1))
    monkeypatch.setattr(P, "read_part_outcome", lambda *args: os._exit(3))
    rt = _read(src, monkeypatch, 3)
    assert rt.processes == 1 and rt.reader == "fast"
    assert _records(rt) == expected


def test_no_fork_in_a_process_running_threads_unless_asked(monkeypatch):
    monkeypatch.delenv(P.ENV_WORKERS, raising=False)
    monkeypatch.setattr(P, "_cores", lambda: 4)
    big = 4 * P.MIN_PART_BYTES
    monkeypatch.setattr(P, "_threads", lambda: 1)
    assert P.workers_for(big) == 4
    assert P.workers_for(P.MIN_PART_BYTES - 1) == 1  # too small to split
    monkeypatch.undo()
    monkeypatch.setattr(P, "_cores", lambda: 4)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert P._threads() > 1
        assert P.workers_for(big) == 1
        monkeypatch.setenv(P.ENV_WORKERS, "3")
        assert P.workers_for(big) == 3
    finally:
        stop.set()
        worker.join()
    monkeypatch.setenv(P.ENV_WORKERS, "not a number")
    assert P.workers_for(big) == 1


def test_decompressed_size(tmp_path):
    text = json.dumps({"traceEvents": [kernel(1, 2, "k", 1)] * 50}).encode()
    plain = tmp_path / "t.json"
    plain.write_bytes(text)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    assert P.decompressed_size(plain) == P.decompressed_size(gz) == len(text)
    points = P.split_points(1000, 3)
    assert points == sorted(points) and 0 < points[0] < points[1] < 1000


def test_a_workers_own_memory_leaves_out_the_pages_it_shares():
    if not P.own_peak_bytes():
        pytest.skip("no /proc/self/smaps_rollup here")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh worker shares nearly all its pages with this process
        try:
            with open("/proc/self/status", encoding="ascii") as fh:
                peak = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmHWM:"))
            os.write(w, json.dumps([P.own_peak_bytes(), peak]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        own, peak = json.loads(fh.read())
    os.waitpid(pid, 0)
    assert 0 < own < peak / 2


def test_without_msgspec_the_workers_are_reaped_and_the_stdlib_path_reads(traces, monkeypatch):
    src = traces / "trace_filter/sampled_rank-0.json.gz"
    expected = _records(R.read_trace_stdlib(src))
    monkeypatch.setenv(P.ENV_WORKERS, "3")
    monkeypatch.setenv("AMPDIAG_TRACE_SCANNER", "0")  # (the compiled scanner needs no msgspec)
    monkeypatch.setitem(sys.modules, "msgspec", None)
    monkeypatch.delitem(sys.modules, "ampdiag.trace.msgspec_events", raising=False)
    rt = R.read_trace(src)
    assert rt.reader == "stdlib" and _records(rt) == expected
    no_children_left()  # no worker left behind, running or unreaped
