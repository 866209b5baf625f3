"""The msgspec decoder of the reader against the lenient standard-library path (the reference)."""

import gzip
import json
import random

import pytest

from ampdiag.analysis.timeline import analyze_rank
from ampdiag.errors import InputError
from ampdiag.trace import decode as F
from ampdiag.trace import reader as R
from ampdiag.trace.lenient import read_lenient
from ampdiag.trace.records import Fallback
from tests.trace.conftest import gpu, kernel, launch, manifest, step, write_trace
from tests.trace.conftest import records as _records


def _close(a, b, path=""):
    """Analysis results equal up to float summation order."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-6), path
    else:
        assert a == b, path


def test_fast_path_reads_every_real_trace_as_the_lenient_path_does(traces):
    for row in manifest(traces):
        path = traces / row["path"]
        if row["events"] == "0":
            with pytest.raises(Fallback):  # not Kineto traces: the stdlib path says why
                F.read_fast(path)
            continue
        fast = F.read_fast(path)
        slow = read_lenient(path)
        assert fast.reader == "fast" and slow.reader == "lenient"
        assert _records(fast) == _records(slow), row["path"]
        _close(analyze_rank(slow), analyze_rank(fast))


def test_read_trace_uses_the_fast_path(traces):
    rt = R.read_trace(traces / "trace_filter/sampled_rank-0.json.gz")
    assert rt.reader == "fast"


def test_other_layouts_and_small_chunks(traces, tmp_path, monkeypatch):
    src = traces / "trace_filter/sampled_rank-0.json.gz"
    slow = read_lenient(src)
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for ev in doc["traceEvents"]:  # "ph" anywhere in the object, compact separators
        items = list(ev.items())
        random.Random(0).shuffle(items)
        ev.clear()
        ev.update(items)
    doc["traceName"] = "after the events"
    other = tmp_path / "compact.json"
    other.write_text(json.dumps(doc, separators=(",", ":")))
    assert _records(F.read_fast(other)) == _records(slow)
    # chunks far smaller than an event: cuts anywhere, buffer growth
    monkeypatch.setattr(F, "CHUNK_BYTES", 64)
    assert _records(F.read_fast(src)) == _records(slow)
    assert _records(F.read_fast(other)) == _records(slow)


def test_non_ascii_names_stay_on_the_fast_path(tmp_path):
    events = [launch(1, 1), kernel(2, 3, "kernel_ü_名前", 1), step(1, 0, 10)]
    path = write_trace(tmp_path / "u.json", events)
    monkeypatch_chunk = F.CHUNK_BYTES
    try:
        F.CHUNK_BYTES = 7  # split multi-byte characters between chunks
        fast = F.read_fast(path)
    finally:
        F.CHUNK_BYTES = monkeypatch_chunk
    assert _records(fast) == _records(read_lenient(path))
    assert gpu(fast)[0][4] == "kernel_ü_名前"


ODD_EVENTS = [
    # repaired or skipped one by one (counted), the rest of the file still decoded by msgspec
    lambda t: t.replace('"dur": 3', '"dur": -3'),
    lambda t: t.replace('"ts": 2', '"ts": NaN'),
    lambda t: t.replace('"correlation": 1,', '"correlation": ' + "9" * 30 + ","),
    lambda t: t.replace('"stream": 7', '"stream": "7"'),
    lambda t: t.replace('"ph": "X", "cat": "kernel"', '"ph": "Q", "cat": "kernel"'),
    lambda t: t.replace('"name": "k", ', ""),
    lambda t: t.replace("[{", '["not an event", {'),
    lambda t: t.replace('"pid": 0', '"pid": 0.5'),
]


@pytest.mark.parametrize("mutate", ODD_EVENTS)
def test_odd_events_stay_on_the_fast_path(tmp_path, mutate):
    events = [launch(1, 1), kernel(2, 3, "k", 1), step(1, 0, 10)]
    # the odd event among 2000 plain ones (which no mutation touches), mid-file
    plain = [
        {**kernel(5000.5 + i, 1.5, "plain", 100000 + i, stream=9), "cat": "gpu_memcpy", "pid": 1}
        for i in range(2000)
    ]
    text = mutate(json.dumps({"traceEvents": plain[:1000] + events + plain[1000:]}))
    path = tmp_path / "odd.json"
    path.write_text(text)
    rt = R.read_trace(path)
    assert rt.reader == "fast"
    assert _records(rt) == _records(read_lenient(path))
    assert len(gpu(rt)) >= 2000


def test_odd_top_level_goes_to_the_lenient_path(tmp_path):
    text = json.dumps({"traceEvents": [launch(1, 1), kernel(2, 3, "k", 1)]})
    path = tmp_path / "twice.json"
    path.write_text(text.replace("{", '{"traceEvents": [], ', 1))  # traceEvents twice
    with pytest.raises(Fallback):
        F.read_fast(path)
    rt = R.read_trace(path)
    assert rt.reader == "lenient" and _records(rt) == _records(read_lenient(path))


def test_an_odd_event_is_skipped_with_a_count_not_the_file(tmp_path):
    plain = [kernel(100 + i, 1, "plain", i) for i in range(5000)]
    plain[2500]["dur"] = -1  # the one odd event
    path = write_trace(tmp_path / "neg.json", plain)
    rt = R.read_trace(path)
    assert rt.reader == "fast"
    assert len(gpu(rt)) == 4999  # counted directly: 5000 written, one with a negative duration
    assert rt.skipped == {"negative duration": 1}


BAD = [
    b"",
    b"{",
    b'{"traceEvents": [{"ph": "X",',
    b'{"traceEvents": [',  # cut right after the list opens (was an IndexError)
    b'{"traceEvents": [{"ph": "i", "name": "x", "ts": 1},  ',
    b'{"traceEvents": [1 2]}',
    b"not json at all",
    b'{"traceEvents": {}}',
    b'{"other": 1}',
    b'{"traceEvents": []} trailing',
    b'{"traceEvents": [' + b"9" * 5000 + b"]}",
    b"\xff\xfe{}",
    b'{"traceEvents": [{"ph": "i", "name": "\xff"}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}',
    b'[{"ph": "X"}]',
]


@pytest.mark.parametrize("content", BAD)
def test_bad_files_give_the_same_error_with_or_without_the_fast_path(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as slow:
        read_lenient(path)
    with pytest.raises(InputError) as fast:
        R.read_trace(path)
    assert str(fast.value) == str(slow.value)
    gz = tmp_path / "bad.json.gz"
    gz.write_bytes(gzip.compress(content))
    with pytest.raises(InputError):
        R.read_trace(gz)


def test_truncated_gzip_same_error(traces, tmp_path):
    data = (traces / "trace_filter/sampled_rank-0.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(Fallback):
        F.read_fast(path)
    with pytest.raises(InputError, match="truncated"):
        R.read_trace(path)
