"""The compiled scanner of the fast reader against msgspec's decoding (the same records)."""

import gzip
import json
import random
import sys

import pytest

from ampdiag.analysis.timeline import analyze_rank
from ampdiag.errors import InputError
from ampdiag.trace import fastread as F
from ampdiag.trace import reader as R
from ampdiag.trace.builder import scanner_groups
from ampdiag.trace.msgspec_events import decode_list
from tests.trace.conftest import kernel, launch, manifest, step, write_trace
from tests.trace.conftest import records as _records

kscan = pytest.importorskip("ampdiag.trace._kscan", reason="the compiled scanner is not built")


@pytest.fixture
def used(monkeypatch):
    """Counts the readings that had the scanner (refused or not)."""
    made = []
    real = F.new_scanner

    def counted():
        scanner = real()
        made.append(scanner is not None)
        return scanner

    monkeypatch.setattr(F, "new_scanner", counted)
    return made


def _both(path, monkeypatch):
    """(records with the scanner, records with msgspec), or the InputError texts."""
    got = []
    for scanner in ("1", "0"):
        monkeypatch.setenv(F.ENV_SCANNER, scanner)
        try:
            got.append(_records(R.read_trace(path)))
        except InputError as exc:
            got.append(str(exc))
    return got


def test_every_real_trace_reads_the_same_as_with_msgspec(traces, monkeypatch, used):
    monkeypatch.setenv("AMPDIAG_TRACE_WORKERS", "1")
    for row in manifest(traces):
        if row["events"] == "0":
            continue
        path = traces / row["path"]
        monkeypatch.setenv(F.ENV_SCANNER, "1")
        fast = F.read_fast(path)
        assert used[-1], row["path"]
        monkeypatch.setenv(F.ENV_SCANNER, "0")
        plain = F.read_fast(path)
        assert not used[-1]
        assert _records(fast) == _records(plain), row["path"]
        assert analyze_rank(fast) == analyze_rank(plain), row["path"]


def test_mutated_traces_give_the_same_outcome(traces, tmp_path, monkeypatch):
    """Fuzz: random edits of a real trace; the scanner accepts exactly what msgspec accepts."""
    text = gzip.decompress((traces / "trace_filter/sampled_rank-1.json.gz").read_bytes())
    doc = json.loads(text)
    doc["traceEvents"] = doc["traceEvents"][:300]
    base = json.dumps(doc, indent=1).encode()
    alphabet = b'{}[],:"\\ -0123456789.eEXitrunlfa\x01\xc3'
    rng = random.Random(7)
    path = tmp_path / "mutated.json"
    for _ in range(400):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            op = rng.random()
            if op < 0.4:
                data[at] = rng.choice(alphabet)
            elif op < 0.7:
                del data[at : at + rng.randint(1, 8)]
            else:
                data[at:at] = bytes([rng.choice(alphabet)])
        path.write_bytes(bytes(data))
        with_scanner, with_msgspec = _both(path, monkeypatch)
        assert with_scanner == with_msgspec, bytes(data)


def test_what_the_scanner_refuses_msgspec_reads(tmp_path, monkeypatch, used):
    events = [launch(1, 1), kernel(2, 3, "k", 1), step(1, 0, 10)]
    text = json.dumps({"traceEvents": events}).replace('"cat": "kernel"', '"cat": "\\u006bernel"')
    path = tmp_path / "escaped.json"
    path.write_text(text)
    monkeypatch.setenv(F.ENV_SCANNER, "1")
    rt = R.read_trace(path)
    assert used == [True] and rt.reader == "fast" and rt.gpu_count == 1
    assert _records(rt) == _records(R.read_trace_stdlib(path))


def test_escaped_names_are_decoded_and_one_name_however_escaped(tmp_path, monkeypatch):
    events = [launch(1, 1), launch(2, 2), kernel(3, 1, "kA_ü", 1), kernel(5, 1, "kA_ü", 2)]
    text = json.dumps({"traceEvents": events}, ensure_ascii=True)  # "k A \u00fc"
    text = text.replace('"kA_\\u00fc"', '"k\\u0041_\\u00fc"', 1)  # the same name, escaped apart
    path = tmp_path / "names.json"
    path.write_text(text)
    monkeypatch.setenv(F.ENV_SCANNER, "1")
    rt = R.read_trace(path)
    assert [g[4] for g in rt.gpu] == ["kA_ü", "kA_ü"]
    assert rt.columns().names.count("kA_ü") == 1
    assert _records(rt) == _records(R.read_trace_stdlib(path))


def test_a_refused_run_leaves_nothing_behind():
    scanner = kscan.Scanner(scanner_groups())
    good = json.dumps([kernel(1, 2, "k", 1)]).encode()
    scanner.feed(good)
    with pytest.raises(ValueError):
        scanner.feed(json.dumps([kernel(3, 4, "k2", 2), {"ph": "Q"}]).encode())
    events, _names, _pids, columns = scanner.state()
    assert events == 1 and len(columns["g_ts"]) == 8


@pytest.mark.parametrize(
    "event",
    [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": "1", "dur": 1},
        {"ph": "X", "cat": "kernel", "name": 5, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "kernel", "ts": 1, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1e301, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 1.5},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"stream": 1.0}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": []},
        {"ph": "Q", "name": "k"},
        {"name": "k"},
    ],
)
def test_the_scanner_refuses_what_msgspec_refuses(event):
    scanner = kscan.Scanner(scanner_groups())
    with pytest.raises(ValueError):
        scanner.feed(json.dumps([event]).encode())
    with pytest.raises(F.Fallback):
        decode_list(json.dumps([event]).encode())


@pytest.mark.parametrize(
    "text",
    [
        '{"ph": "X", "cat": "kernel", "name": "a", "name": "b", "ts": 1, "dur": 1}',
        '{"ph": "X", "cat": "kernel", "name": "a", "n\\u0061me": "b", "ts": 1, "dur": 1}',
        '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"str\\u0065am": 3}}',
    ],
)
def test_repeated_and_escaped_keys_read_as_msgspec_reads_them(tmp_path, monkeypatch, text):
    path = tmp_path / "keys.json"
    path.write_text('{"traceEvents": [' + text + "]}")
    with_scanner, with_msgspec = _both(path, monkeypatch)
    assert with_scanner == with_msgspec


def test_an_uninitialized_scanner_raises():
    with pytest.raises(RuntimeError):
        kscan.Scanner.__new__(kscan.Scanner).feed(b"[]")


def test_non_complete_events_may_hold_anything(tmp_path, monkeypatch):
    events = [
        {"ph": "i", "name": 5, "ts": "x", "pid": 1.5, "args": [1, {"a": [None, True]}]},
        {"ph": "M", "args": {"stream": "not an int"}},
        launch(1, 1),
        kernel(2, 3, "k", 1),
        step(1, 0, 10),
    ]
    path = write_trace(tmp_path / "other.json", events)
    with_scanner, with_msgspec = _both(path, monkeypatch)
    assert with_scanner == with_msgspec and with_scanner[4] == 5  # events counted


def test_without_msgspec_the_scanner_still_reads(traces, monkeypatch, used):
    src = traces / "trace_filter/sampled_rank-0.json.gz"
    expected = _records(R.read_trace_stdlib(src))
    monkeypatch.setenv(F.ENV_SCANNER, "1")
    monkeypatch.setitem(sys.modules, "msgspec", None)
    monkeypatch.delitem(sys.modules, "ampdiag.trace.msgspec_events", raising=False)
    rt = R.read_trace(src)
    assert used[-1] and rt.reader == "fast" and _records(rt) == expected
