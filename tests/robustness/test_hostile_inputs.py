"""Hostile input to ``ampdiag report``: one line and exit 2 (or a report), bounded.

Every input is generated here (none is committed). Each runs ``python -m ampdiag report`` in a
child process with its address space capped at 1 GiB and a 10 s deadline: a runaway
allocation fails there, a hang times out, and the test sees the exit status — never 1 (an
internal error) and never a signal.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ampdiag.errors import InputError
from ampdiag.sources import safe_pickle
from tests.robustness.subproc import REPO

LIMIT_BYTES = 1024**3
DEADLINE_S = 10.0


def report(path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``ampdiag report PATH --format json`` under the limits; (process, seconds)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ampdiag", "report", str(path), "--format", "json", *extra],
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S + 20,  # the assertion below is the contract; this only unblocks
        preexec_fn=limit,
    )
    return proc, time.perf_counter() - started


def assert_answered(path: Path, codes: tuple[int, ...] = (2,)) -> subprocess.CompletedProcess[str]:
    proc, seconds = report(path)
    assert proc.returncode in codes, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    if proc.returncode == 2:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ampdiag: "), proc.stderr[-2000:]
    assert seconds <= DEADLINE_S, f"{seconds:.1f} s"
    return proc


def doubling_graph(levels: int = 40) -> Any:
    """A value whose tree form doubles at each level: ``str()`` of it never finishes."""
    value: Any = ["frame"]
    for _ in range(levels):
        value = [value, value]
    return value


def write_pickle(path: Path, value: Any) -> Path:
    path.write_bytes(pickle.dumps(value, protocol=4))
    return path


def test_a_tiny_pickle_whose_text_doubles_40_times(tmp_path: Path) -> None:
    graph = doubling_graph()
    frames = [graph, {"filename": graph, "line": graph, "name": graph}]
    snap = {
        "segments": [
            {
                "device": 0,
                "total_size": 1024,
                "blocks": [
                    {"state": "active_allocated", "address": 1, "size": 8, "frames": frames}
                ],
            }
        ],
        "device_traces": [[{"action": "alloc", "addr": 2, "size": 8, "frames": frames}]],
    }
    path = write_pickle(tmp_path / "snapshot.pickle", snap)
    assert path.stat().st_size < 2000
    proc = assert_answered(path, (0, 2))
    if proc.returncode == 0:
        assert len(proc.stdout) < 1_000_000


def test_twenty_thousand_ooms_are_not_replayed_one_by_one(tmp_path: Path) -> None:
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    trace = []
    for i in range(20_000):
        trace.append({"action": "alloc", "addr": 4096 * i, "size": 512, "frames": frames})
        trace.append({"action": "oom", "size": 1 << 30, "device_free": 0, "frames": frames})
    snap = {
        "segments": [{"device": 0, "total_size": 1 << 30, "blocks": []}],
        "device_traces": [trace],
    }
    path = write_pickle(tmp_path / "snapshot.pickle", snap)
    proc = assert_answered(path, (0,))
    memory = json.loads(proc.stdout)["memory"]["cuda"]
    assert memory["oom_count"] == 20_000
    ooms = memory["ooms"]
    assert len(ooms) == 20
    # Each described OOM saw the allocations before it: one more 512-byte block per pair.
    assert [o["allocated_bytes"] - ooms[0]["allocated_bytes"] for o in ooms] == [
        512 * i for i in range(20)
    ]
    assert [o["event_index"] for o in ooms] == [2 * i + 1 for i in range(20)]


def test_a_dev_zero_symlink_named_pickle(tmp_path: Path) -> None:
    link = tmp_path / "zero.pickle"
    link.symlink_to("/dev/zero")
    proc = assert_answered(link)
    assert "not a regular file" in proc.stderr


def test_a_fifo_named_pickle(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.pickle"
    os.mkfifo(fifo)
    proc = assert_answered(fifo)
    assert "not a regular file" in proc.stderr


def test_deep_nesting_in_a_pickle(tmp_path: Path) -> None:
    depth = 200_000  # built opcode by opcode: pickle.dumps itself would recurse
    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    path = tmp_path / "deep.pickle"
    path.write_bytes(data)
    proc = assert_answered(path)
    assert "nested deeper" in proc.stderr


@pytest.mark.parametrize(
    "snap",
    [
        [1, 2, 3],
        7,
        {"segments": "abc"},
        {"segments": [1, "x", {"blocks": 5}], "device_traces": [5, None]},
        {
            "segments": [{"blocks": [{"state": "active_allocated", "address": "x", "size": [1]}]}],
            "device_traces": [[{"action": "alloc", "size": {"a": 1}, "addr": None, "frames": 5}]],
        },
        {
            "segments": [{"device": "zero", "total_size": 10**5000}],
            "device_traces": [[{"action": "oom", "size": 10**5000, "frames": [{"filename": 5}]}]],
        },
        {"segments": [], "device_traces": [[{"action": "free_completed", "size": -(10**30)}]]},
    ],
    ids=["list", "int", "text-segments", "odd-items", "odd-fields", "huge-ints", "negative"],
)
def test_wrong_shaped_snapshots(tmp_path: Path, snap: Any) -> None:
    path = write_pickle(tmp_path / "snapshot.pickle", snap)
    proc = assert_answered(path, (0, 2))
    if proc.returncode == 0:
        json.loads(proc.stdout)  # a report of what could be read, as valid JSON


@pytest.mark.parametrize(
    "make",
    [
        lambda: "[" * 200_000 + "]" * 200_000,
        lambda: '{"schema_version": 1, "steps": [{"index": ' + "9" * 5000 + "}]}",
        lambda: "[]",
    ],
    ids=["deep", "huge-int", "not-an-object"],
)
def test_hostile_session_files(tmp_path: Path, make: Callable[[], str]) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "session.json").write_text(make())
    assert_answered(folder)


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists any folder")
def test_an_unlistable_folder(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        assert_answered(folder)
    finally:
        folder.chmod(0o700)


def test_the_container_limit_counts_shared_containers_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = doubling_graph(40)  # 41 distinct lists, 2^41 as a tree
    safe_pickle.check_bounded(graph)
    monkeypatch.setattr(safe_pickle, "MAX_OBJECTS", 1000)
    many = [[i] for i in range(2000)]
    with pytest.raises(InputError, match="more than 1000 containers"):
        safe_pickle.loads_plain(pickle.dumps(many))
