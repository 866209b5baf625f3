"""A folder is read as it is now: not the report's own output, not foreign JSON, not old runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ampdiag.cli import main
from ampdiag.session import Session
from tests.distributed.synthetic import rank_traces


def _json(capsys: object, *argv: str) -> dict[str, object]:
    assert main(["report", *argv, "--format", "json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    return doc


def test_foreign_json_is_skipped_with_a_warning(tmp_path: Path, capsys: object) -> None:
    rank_traces(tmp_path, None)
    (tmp_path / "metrics.json").write_text(json.dumps({"loss": [1.0, 0.5]}))
    timeline = _json(capsys, str(tmp_path))["timeline"]
    assert [r["rank"] for r in timeline["ranks"]] == [0, 1]  # type: ignore[index]
    assert any("metrics.json" in w for w in timeline["warnings"])  # type: ignore[index]


def test_only_foreign_json_is_one_clear_line(tmp_path: Path, capsys: object) -> None:
    (tmp_path / "metrics.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert len(err.strip().splitlines()) == 1 and "no Kineto traces" in err


def test_a_second_report_reads_the_traces_again(tmp_path: Path, capsys: object) -> None:
    rank_traces(tmp_path, None)
    assert main(["report", str(tmp_path)]) == 0  # writes session.json + report.html here
    capsys.readouterr()  # type: ignore[attr-defined]
    assert (tmp_path / "session.json").is_file()
    (tmp_path / "rank-1.json").unlink()
    ranks = _json(capsys, str(tmp_path))["timeline"]["ranks"]  # type: ignore[index]
    assert [r["rank"] for r in ranks] == [0]


def _rank_session(folder: Path, rank: int, trace: Path, world: int = 2) -> None:
    """A rank's diagnose() output: its session naming its trace, the trace under trace/."""
    (folder / "trace").mkdir(parents=True)
    shutil.copy(trace, folder / "trace" / trace.name)
    Session(
        environment={"rank": rank, "world_size": world},
        steps=[{"index": i, "wall_s": 0.01 * (1 + rank)} for i in range(3)],
        sections={"profiler": {"trace_files": [f"trace/{trace.name}"]}},
    ).save(folder)


def test_rank_folders_merge_only_the_traces_their_sessions_name(
    tmp_path: Path, capsys: object
) -> None:
    runs = tmp_path / "traces"
    old, new = runs / "old", runs / "new"
    old.mkdir(parents=True)
    new.mkdir()
    rank_traces(old, 0, delay_us=4000.0)  # an earlier run: rank 0 was the straggler
    rank_traces(new, 1, delay_us=4000.0)  # this run: rank 1
    out = tmp_path / "out"
    for rank in (0, 1):
        _rank_session(out / f"rank-{rank}", rank, new / f"rank-{rank}.json")
        # the earlier run's trace left in the same trace/ folder
        shutil.copy(old / f"rank-{rank}.json", out / f"rank-{rank}" / "trace" / "earlier.json")
    doc = _json(capsys, str(out))
    assert len(doc["timeline"]["ranks"]) == 2  # type: ignore[index]
    found = {f["id"]: f for f in doc["findings"]}  # type: ignore[attr-defined]
    assert found["straggler-rank"]["evidence"]["rank"] == 1
    rows = doc["ranks"]["rows"]  # type: ignore[index]
    assert [r["step_ms_median"] for r in rows] == [10.0, 20.0]


def test_ranks_of_two_world_sizes_are_refused(tmp_path: Path, capsys: object) -> None:
    traces = tmp_path / "t"
    traces.mkdir()
    rank_traces(traces, None)
    for rank, world in ((0, 2), (1, 2), (2, 4)):
        _rank_session(tmp_path / "out" / f"rank-{rank}", rank, traces / "rank-0.json", world)
    assert main(["report", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert len(err.strip().splitlines()) == 1 and "different world sizes" in err


def test_the_merged_report_imports_no_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    traces = tmp_path / "t"
    traces.mkdir()
    rank_traces(traces, 1)
    for rank in (0, 1):
        _rank_session(tmp_path / "out" / f"rank-{rank}", rank, traces / f"rank-{rank}.json")
    code = (
        "import sys\nfrom ampdiag.cli import main\n"
        f"assert main(['report', {str(tmp_path / 'out')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    ranks = html[html.index('<section id="ranks"') :]
    ranks = ranks[: ranks.index("</section>")]
    assert "rank-step-times" in ranks  # the per-rank step-time chart
    assert ranks.count("<tr>") >= 3  # a header and one row per rank
    assert "1 <strong>(straggler)</strong>" in ranks


def test_a_session_with_a_nested_source_key_is_read_as_a_session(
    tmp_path: Path, capsys: object
) -> None:
    # a live run's session whose environment names no source, with a "source" deeper in
    Session(
        environment={"rank": 0, "world_size": 1, "device_type": "cpu"},
        sections={"timeline": {"source": "trace", "ranks": []}},
        steps=[{"index": 0, "wall_s": 0.5}],
    ).save(tmp_path)
    doc = _json(capsys, str(tmp_path))
    assert doc["environment"]["device_type"] == "cpu"
    assert [s["wall_s"] for s in doc["steps"]] == [0.5]  # type: ignore[index]


def test_a_merged_session_of_an_older_version_is_analysed_from_its_members() -> None:
    from ampdiag.analysis import analyze

    saved = Path(__file__).parents[1] / "data" / "sessions" / "main-f6ce857.json"
    doc = json.loads(saved.read_text(encoding="utf-8"))
    doc.pop("findings", None)
    alone = {f.id for f in analyze(Session.from_dict(doc))}
    assert alone  # a real saved session with a finding of its own
    merged = Session(
        environment={"source": "ranks", "world_size": 2},
        sections={"ranks": {"members": [{"rank": r, "session": doc} for r in (0, 1)]}},
    )
    found = analyze(merged)
    assert {f.id for f in found} == alone
    assert all(f.evidence["ranks"] == "all" for f in found)


def test_a_pool_merges_many_ranks_as_one_process_does(tmp_path: Path, monkeypatch: object) -> None:
    import ampdiag.sources.traces as traces
    from ampdiag.sources.ranks import session_from_ranks

    made = tmp_path / "made"
    made.mkdir()
    rank_traces(made, 1, delay_us=4000.0)
    out = tmp_path / "out"
    n = 2 * traces.POOL_MIN_JOBS + 3  # a pool of 2 workers where 2 cores are free
    for rank in range(n):  # the traces name ranks 0 and 1 only: the rest are kept by position
        _rank_session(out / f"rank-{rank}", rank, made / f"rank-{rank % 2}.json", world=n)
    pooled = session_from_ranks(out).to_dict()
    monkeypatch.setattr(traces, "POOL_MIN_JOBS", 10**9)  # type: ignore[attr-defined]
    alone = session_from_ranks(out).to_dict()
    for doc in (pooled, alone):
        doc.pop("created")
    assert pooled == alone
    assert [r["rank"] for r in pooled["timeline"]["ranks"]] == list(range(n))
    assert sum("appears twice" in w for w in pooled["timeline"]["warnings"]) == n - 2
