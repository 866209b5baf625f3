"""The memory view of a trace: held against a replay of its ``[memory]`` events done here.

Fixtures: ``profile_memory/cpu_mlp_memory_modules.pt.trace.json.gz`` (recorded with
torch.profiler on CPU, ``profile_memory=True, with_modules=True, with_stack=True``: see the
README there) and HTA's ``df_index_resolver`` (CUDA, 2 devices' worth of allocator events).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ampdiag.analysis.memory_timeline import trace_memory
from ampdiag.analysis.timeline import analyze_rank
from ampdiag.trace.reader import read_trace
from tests.trace.conftest import FIXTURES

CPU_TRACE = FIXTURES / "profile_memory" / "cpu_mlp_memory_modules.pt.trace.json.gz"
CUDA_TRACE = FIXTURES / "df_index_resolver" / "df_index_resolver.json.gz"


def _events(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])


def _replay(events: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[int, float]]:
    """Per (device type, id): the most bytes live, replaying Bytes from what the first event
    says was allocated before it, and when (the first time it is reached)."""
    out: dict[tuple[int, int], tuple[int, float]] = {}
    live: dict[tuple[int, int], int] = {}
    mem = [e for e in events if e.get("ph") == "i" and e.get("name") == "[memory]"]
    for e in sorted(mem, key=lambda e: e["ts"]):
        a = e["args"]
        key = (a["Device Type"], a.get("Device Id", -1))
        if key not in live:
            live[key] = a["Total Allocated"] - a["Bytes"]
        live[key] += a["Bytes"]
        if key not in out or live[key] > out[key][0]:
            out[key] = (live[key], e["ts"])
    return out


@pytest.mark.parametrize("path", [CPU_TRACE, CUDA_TRACE], ids=["cpu-trace", "v100-trace"])
def test_peak_is_the_replays(path):
    events = _events(path)
    replay = _replay(events)
    rt = read_trace(path)
    view = trace_memory(rt)
    assert view is not None
    assert len(view["devices"]) == len(replay)
    t0 = min(
        [min(e["ts"] for e in events if e.get("name") == "[memory]")] + [s[1] for s in rt.steps]
    )
    for d in view["devices"]:
        match = [k for k in replay if d["device"].startswith("CPU" if k[0] == 0 else "cuda")]
        assert match, d["device"]
        best = max(match, key=lambda k: replay[k][0]) if d["device"] == "CPU" else None
        key = best or next(k for k in match if d["device"] == f"cuda:{k[1]}")
        peak, at = replay[key]
        assert d["peak"]["bytes"] == peak
        assert d["peak"]["t_ms"] == pytest.approx((at - t0) / 1000)
        assert max(d["allocated"]) == peak  # the thinned curve keeps the peak


def _innermost_op(ops: list[dict[str, Any]], e: dict[str, Any]) -> str | None:
    """The shortest op of the event's thread whose span holds its time: brute force."""
    holding = [
        o
        for o in ops
        if o["tid"] == e["tid"]
        and o["pid"] == e["pid"]
        and o["ts"] <= e["ts"] <= o["ts"] + o["dur"]
    ]
    return min(holding, key=lambda o: (o["dur"], -o["ts"]))["name"] if holding else None


def test_allocating_ops_and_what_they_hold_at_the_peak():
    events = _events(CPU_TRACE)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    mem = sorted(
        (e for e in events if e.get("ph") == "i" and e.get("name") == "[memory]"),
        key=lambda e: e["ts"],
    )
    ((peak, at),) = _replay(events).values()
    allocated: dict[str, int] = {}
    held: dict[str, int] = {}
    live: dict[int, tuple[int, str]] = {}
    for e in mem:
        a = e["args"]
        name = _innermost_op(ops, e) or "(no op)"
        if a["Bytes"] > 0:
            allocated[name] = allocated.get(name, 0) + a["Bytes"]
            live[a["Addr"]] = (a["Bytes"], name)
        else:
            live.pop(a["Addr"], None)
        if e["ts"] == at:
            for size, owner in live.values():
                held[owner] = held.get(owner, 0) + size
    view = trace_memory(read_trace(CPU_TRACE))
    assert view is not None
    for row in view["top_ops"]:
        assert row["allocated_bytes"] == allocated[row["name"]], row
        assert row["held_at_peak_bytes"] == held.get(row["name"], 0), row
    top = sorted(allocated.items(), key=lambda kv: (-kv[1], kv[0]))[: len(view["top_ops"])]
    assert [r["name"] for r in view["top_ops"]] == [n for n, _ in top]
    # all the bytes live at the peak were allocated in the trace (it began with none)
    assert sum(held.values()) == peak


def test_module_time_is_the_sum_of_its_spans():
    events = _events(CPU_TRACE)
    spans: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: "):
            row = spans.setdefault(e["name"][len("nn.Module: ") :], [0, 0.0])
            row[0] += 1
            row[1] += e["dur"]
    r = analyze_rank(read_trace(CPU_TRACE))
    assert {m["module"]: [m["calls"], m["inclusive_us"]] for m in r["modules"]} == {
        k: [c, pytest.approx(t)] for k, (c, t) in spans.items()
    }
    assert {"Linear_0", "Linear_1", "ReLU_0", "Sequential_0"} <= set(spans)


def test_report_shows_the_memory_view_without_torch(tmp_path):
    out = tmp_path / "rep"
    code = (
        "import sys, runpy; sys.argv = ['ampdiag', 'report', sys.argv[1], '--out', sys.argv[2]];"
        "import ampdiag.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        "assert 'torch' not in sys.modules, 'report imported torch'\n"
        "sys.exit(code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(CPU_TRACE), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    html = (out / "report.html").read_text()
    peak, _ = next(iter(_replay(_events(CPU_TRACE)).values()))
    assert (
        "memory (the trace&#39;s [memory] allocator events)" in html or "[memory] allocator" in html
    )
    assert f"{peak / 1024:.1f} KiB" in html  # the peak, as the replay counts it
    assert "Ops that allocate the most" in html and "held at the peak" in html
    assert "Memory, rank 0, CPU" in html  # the curve
    assert "time per module" in html
    session = json.loads((out / "session.json").read_text())
    (rank,) = session["timeline"]["ranks"]
    assert rank["memory"]["devices"][0]["peak"]["bytes"] == peak


def test_the_memory_chart_draws_the_replays_peak_and_low():
    """The HTML curve is the replay's, drawn as is: its highest and lowest points are the
    replay's (a curve averaged for drawing showed 6,272 of the 6,322 MiB peak)."""
    import re

    from ampdiag.render.html import render_html
    from ampdiag.sources.traces import session_from_traces

    live: dict[tuple[int, int], int] = {}
    lows: dict[tuple[int, int], int] = {}
    mem = [e for e in _events(CUDA_TRACE) if e.get("ph") == "i" and e.get("name") == "[memory]"]
    for e in sorted(mem, key=lambda e: e["ts"]):
        a = e["args"]
        key = (a["Device Type"], a.get("Device Id", -1))
        live[key] = live.get(key, a["Total Allocated"] - a["Bytes"]) + a["Bytes"]
        lows[key] = min(lows.get(key, live[key]), live[key])
    peaks = _replay(_events(CUDA_TRACE))
    html = render_html(session_from_traces(CUDA_TRACE))
    charts = [s for s in re.findall(r"<svg\b.*?</svg>", html, re.S) if ", cuda:" in s]
    assert charts
    # the CPU's allocations (a few bytes at their peak, by the replay) get a row, not a chart
    cpu_peak = max(v[0] for k, v in peaks.items() if k[0] == 0)
    assert cpu_peak < 0.01 * max(v[0] for v in peaks.values())
    assert "<td>CPU</td>" in html and not re.search(r"Memory, rank \d+, CPU", html)
    for svg in charts:
        device = int(re.search(r"Memory, rank \d+, cuda:(\d+)<", svg).group(1))  # type: ignore[union-attr]
        shown = [
            float(v.replace(",", ""))
            for v in re.findall(r"<title>allocated — ms [^:]*: ([\d,.]+) MiB</title>", svg)
        ]
        # the tooltips state MiB to 4 significant digits
        assert max(shown) == pytest.approx(peaks[(1, device)][0] / 2**20, abs=0.5)
        assert min(shown) == pytest.approx(lows[(1, device)] / 2**20, abs=0.5)
