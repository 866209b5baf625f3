import contextlib
import gzip
import json
import random

import pytest

from ampdiag.cli import main
from ampdiag.errors import InputError
from ampdiag.trace import lenient as S
from ampdiag.trace.reader import read_trace
from tests.trace.conftest import gpu, host, kernel, launch, launches, manifest, step, write_trace


def test_reads_every_manifest_trace_with_its_counts(traces):
    for row in manifest(traces):
        path = traces / row["path"]
        if row["events"] == "0":  # not Kineto traces: said clearly, see test_foreign_files
            with pytest.raises(InputError, match="not a Kineto trace"):
                read_trace(path)
            continue
        rt = read_trace(path)
        # the manifest's counts were made with json.load; ours come from the streaming reader
        assert rt.events == int(row["events"]), row["path"]
        assert sum(1 for g in gpu(rt) if g[5] == "kernel") == int(row["gpu_kernels"]), row["path"]
        if row["rank"] != "-":
            assert rt.rank == int(row["rank"])
        assert not rt.skipped


def test_foreign_files(traces):
    with pytest.raises(InputError, match="execution trace"):
        read_trace(traces / "execution_trace/benchmark_simple_add_et.json.gz")
    with pytest.raises(InputError, match="JSON list"):
        read_trace(traces / "memory_analysis/memory_timeline.raw.gz")


def _records(rt):
    return (
        sorted(gpu(rt)),
        sorted(launches(rt).items()),
        rt.steps,
        sorted(host(rt), key=repr),
        rt.events,
    )


def test_general_path_equals_fast_path(traces, tmp_path):
    src = traces / "trace_filter/sampled_rank-0.json.gz"
    fast = read_trace(src)
    doc = json.loads(gzip.decompress(src.read_bytes()))
    # another writer's layout: compact separators and shuffled keys -> the general path
    for ev in doc["traceEvents"]:
        items = list(ev.items())
        random.Random(0).shuffle(items)
        ev.clear()
        ev.update(items)
    other = tmp_path / "compact.json"
    other.write_text(json.dumps(doc, separators=(",", ":")))
    general = read_trace(other)
    assert _records(general) == _records(fast)
    assert _records(S.read_lenient(other)) == _records(fast)


def test_small_chunks_split_events_anywhere(traces, monkeypatch):
    src = traces / "with_gpu_user_annotation/step_based_trace_2543932.json.gz"
    whole = read_trace(src)
    monkeypatch.setattr(S, "CHUNK_CHARS", 997)
    assert _records(read_trace(src)) == _records(whole)


def test_variations(tmp_path):
    # float ns-precision timestamps, legacy categories, no distributedInfo, rank in the file name
    events = [
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 100.125,
            "dur": 2.5,
            "args": {"stream": 7, "correlation": 1},
        },
        {
            "ph": "X",
            "cat": "Runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 99.5,
            "dur": 1.0,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "Memcpy",
            "name": "Memcpy HtoD",
            "pid": 0,
            "tid": 7,
            "ts": 110.0,
            "dur": 1.0,
            "args": {"stream": 7, "correlation": 2},
        },
        {
            "ph": "X",
            "cat": "Operator",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 99.0,
            "dur": 3.0,
        },
    ]
    rt = read_trace(write_trace(tmp_path / "worker_rank-3.pt.trace.json", events))
    assert rt.rank == 3 and rt.rank_source == "file name"
    assert gpu(rt)[0][:2] == (100.125, 2.5) and gpu(rt)[0][5] == "kernel"
    assert gpu(rt)[1][5] == "memcpy"
    assert launches(rt)[1][0] == 99.5
    assert rt.cpu_ops["aten::mm"] == [1, 3.0]


def test_bad_events_are_skipped_with_a_warning(tmp_path):
    events = [
        kernel(10, 5, "good", 1),
        {"ph": "X", "cat": "kernel", "name": "no ts", "dur": 3},
        kernel(20, -4, "negative", 2),
        kernel(30, 1, "huge ints", 3),
        "not an object",
        {"ph": "X", "cat": "kernel", "name": "nan", "ts": float("nan"), "dur": 1},
    ]
    path = tmp_path / "t.json"
    text = json.dumps({"traceEvents": events}).replace(
        '"correlation": 3', '"correlation": ' + "9" * 30
    )
    path.write_text(text.replace("NaN", "NaN"))
    rt = read_trace(path)
    assert [g[4] for g in gpu(rt)] == ["good", "huge ints"]
    assert (
        gpu(rt)[1][3] == -1
    )  # a correlation beyond 64 bits is kept as "none": it matches no launch
    assert rt.skipped == {
        "missing or invalid ts/dur": 1,
        "negative duration": 1,
        "not a JSON object": 1,
        "non-finite timestamp or duration": 1,
    }
    assert any("negative duration" in w for w in rt.warnings)


def test_empty_trace_events_is_a_trace_without_gpu(tmp_path):
    rt = read_trace(write_trace(tmp_path / "e.json", []))
    assert rt.events == 0 and gpu(rt) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"{", "truncated|expected"),
        (b'{"traceEvents": [{"ph": "X",', "truncated|not valid JSON"),
        (b'{"traceEvents": [1 2]}', "not valid JSON"),
        (b"not json at all", "not valid JSON"),
        (b'{"traceEvents": {}}', "not a list"),
        (b'{"other": 1}', "no 'traceEvents'"),
        (b'{"traceEvents": []} trailing', "data after"),
        (b'{"traceEvents": [' + b"9" * 5000 + b"]}", "cannot decode|Exceeds"),
        (b"\xff\xfe{}", "UTF-8"),
    ],
)
def test_bad_files_raise_input_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_trace(path)


def test_truncated_gzip(traces, tmp_path):
    data = (traces / "trace_filter/sampled_rank-0.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated"):
        read_trace(path)


def test_fuzz_mutated_real_traces_never_crash(traces, tmp_path, capsys):
    base = gzip.decompress(
        (traces / "with_gpu_user_annotation/step_based_trace_2543932.json.gz").read_bytes()
    )
    rng = random.Random(1234)
    outcomes = {0: 0, 2: 0}
    for i in range(60):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            pos = rng.randrange(len(data))
            if op < 0.4:
                data[pos] = rng.choice(b'{}[]",:0123456789-eE.\\ xX')
            elif op < 0.7:
                del data[pos : pos + rng.randint(1, 200)]
            elif op < 0.85:
                data[pos:pos] = rng.choice([b"1e999", b"-", b"99999999999999999999999", b"null"])
            else:
                del data[pos:]
        path = tmp_path / f"m{i}.json"
        path.write_bytes(bytes(data))
        with contextlib.suppress(InputError):
            read_trace(path)
        code = main(["report", str(path), "--format", "json"])
        assert code in (0, 2), capsys.readouterr().err
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if code == 2:
            assert err.count("\n") == 1 and err.startswith("ampdiag: ")
        outcomes[code] += 1
    assert outcomes[0] and outcomes[2]  # both outcomes were exercised


def test_hta_rounding_helper_matches_manual(tmp_path):
    # used by the oracle tests to reproduce HTA's inward rounding of fractional timestamps
    from tests.trace.test_timeline_hta import hta_round

    rt = read_trace(
        write_trace(tmp_path / "r.json", [launch(0.5, 1, 2.0), kernel(1.2, 1.5, "k", 1)])
    )
    hta_round(rt)
    assert gpu(rt) == [(2.0, 0.0, 7, 1, "k", "kernel")]
    assert launches(rt) == {1: (1.0, 1.0, "cudaLaunchKernel")}


def test_step_spans(tmp_path):
    rt = read_trace(
        write_trace(
            tmp_path / "s.json",
            [step(5, 200, 50), step(4, 100, 90), launch(101, 1), kernel(103, 4, "k", 1)],
        )
    )
    assert [s[0] for s in rt.steps] == [4, 5]
