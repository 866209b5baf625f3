"""At the exit the profiled window's trace is read once for every section that needs it.

The memory timeline and the profiler's step breakdown each need the whole trace. Truth: the
reader's calls counted during the block's exit; the breakdown computed from a fresh read of the
file afterwards, the recorded steps taken as the profiler's section lists them; the trace the
sections shared compared with that fresh read, so that neither section changed it for the other.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import ampdiag
from ampdiag.analysis.timeline import host_breakdown
from ampdiag.trace import reader
from tests.conftest import train


def test_the_trace_is_read_once_and_left_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Any] = []
    real = reader.read_trace

    sources: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        rt = real(*args, **kwargs)
        reads.append((rt, copy.deepcopy(rt.steps)))
        sources.append(str(args[0]))
        return rt

    monkeypatch.setattr(reader, "read_trace", counting)
    holder: dict[str, Any] = {}

    def wrap() -> Any:
        holder["d"] = ampdiag.diagnose(out=tmp_path / "run", report=False, tensorboard=False)
        return holder["d"]

    train(steps=4, wrap=wrap)  # ends inside the profiled window: a stub step in the trace
    d = holder["d"]
    s = d.session
    assert len(d.run.trace_files) == 1
    assert len(reads) == 1  # the memory timeline and the breakdown: one read
    # read from the exported JSON before it was gzipped (no decompression), named as written
    assert sources[0].endswith(".pt.trace.json") and reads[0][0].path == d.run.trace_files[0]
    assert str(d.run.trace_files[0]).endswith(".pt.trace.json.gz")
    assert d.run.traces == {}  # not held after the session is built
    shared, steps_as_read = reads[0]
    assert shared.steps == steps_as_read  # neither section changed the shared trace
    assert s.section("memory")["timeline"]["t_ms"]  # the timeline was made from it

    fresh = real(d.run.trace_files[0])
    assert fresh.steps == shared.steps
    prof = s.section("profiler")
    fresh.steps = [st for st in fresh.steps if st[0] in prof["recorded_steps"]]
    assert len(fresh.steps) < len(shared.steps)  # the stub is not a recorded step
    assert prof["breakdown"] == host_breakdown(fresh)
