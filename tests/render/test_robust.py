"""Renderers only format, never break, and stay bounded: the import graph (no plotting
library), names with any text, a long run, and a section that cannot be rendered."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampdiag.analysis import analyze
from ampdiag.render import charts, svg
from ampdiag.render.html import render_html, write_html
from ampdiag.render.tensorboard import write_tensorboard
from ampdiag.session import Finding, Session

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "ampdiag" / "render"
#: Names that broke the report: a lone surrogate, invalid mathtext, markup.
ODD = ["bad\ud800name", "$\\frac{$", "a$b$c$", "<b>x</b>"]


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


#: What render/ may import from analysis/: the diff's result types (what it formats, as a
#: Session is for the report), nothing that computes.
RESULT_TYPES = {"ampdiag.analysis.diff"}


def test_render_imports_no_analysis_and_only_tensorboard_needs_torch() -> None:
    """Statically, lazy imports included: render/ formats the Session, it computes nothing."""
    for path in RENDER.rglob("*.py"):
        mods = imports_of(path) - RESULT_TYPES
        rel = path.relative_to(REPO).as_posix()
        for forbidden in ("ampdiag.analysis", "ampdiag.sources", "ampdiag.trace"):
            assert not [m for m in mods if m.startswith(forbidden)], (rel, mods)
        if path.name != "tensorboard.py":
            assert not [m for m in mods if m.split(".")[0] == "torch"], rel
        if path.name != "plot.py":  # ampdiag.plot's figures, on demand
            assert not [m for m in mods if m.split(".")[0] == "matplotlib"], rel


def test_html_and_console_load_no_torch_matplotlib_or_analysis() -> None:
    """At run time: a report rendered in a fresh process loads none of them."""
    code = """
import json, sys
from ampdiag.session import Session, Finding
from ampdiag.render.html import render_html
from ampdiag.render.console import summary
s = Session(steps=[{"index": i, "wall_s": 0.1 + i / 100} for i in range(5)],
            sections={"profiler": {"top_ops": [{"name": "aten::mm", "calls": 3,
                      "self_cpu_us": 5.0, "self_device_us": 0.0}]},
                      "speed_probe": {"fp32_ms": 2.0, "autocast_ms": 1.0}},
            findings=[Finding("x", "high", "t", {"a_bytes": 3}, "fix it.")])
render_html(s); summary(s)
bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "matplotlib")
       or m.startswith("ampdiag.analysis")]
print(json.dumps(bad))
"""
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def odd_session() -> Session:
    """A session whose every user-named thing is one of ODD."""
    name = " ".join(ODD)
    return Session(
        environment={"device_name": name, "autocast": "cpu:bfloat16"},
        steps=[{"index": i, "wall_s": 0.01} for i in range(3)],
        sections={
            "profiler": {
                "top_ops": [{"name": n, "calls": 1, "self_cpu_us": 1.0} for n in ODD],
                "breakdown": {
                    "steps": [{"step": 1, "total_us": 10.0, "forward_us": 10.0}],
                    "share": {"forward": 1.0},
                },
            },
            "speed_probe": {
                "fp32_ms": 1.0,
                "autocast_ms": 2.0,
                "autocast": name,
                "modules": [{"module": n, "fp32_ms": 1.0, "autocast_ms": 2.0} for n in ODD],
            },
            "memory": {"peak": {"bytes": 100, "by_category": {n: 25 for n in ODD}}},
            "activations": {
                "modules": [{"module": n, "max_abs": 3.0, "output_dtype": n} for n in ODD]
            },
        },
        findings=[Finding("odd", "high", name, {name: name}, name, section="time")],
    )


def test_any_name_renders_in_html_and_tensorboard_offline(tmp_path: Path) -> None:
    session = odd_session()
    session.findings = [*analyze(session), *session.findings]
    report = write_html(session, tmp_path)
    html = report.read_bytes().decode("utf-8")  # valid UTF-8: the surrogate became "?"
    assert "bad?name" in html and "$\\frac{$" in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "could not be rendered" not in html
    assert list(write_tensorboard(session, tmp_path).glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_any_module_name_renders_in_a_live_run(tmp_path: Path) -> None:
    import torch
    from torch import nn

    import ampdiag

    torch.manual_seed(0)
    model = nn.Sequential()
    for i, name in enumerate(["bad\ud800name", "$\\frac{$", "a$b$c$"]):
        model.add_module(name, nn.Linear(8, 8) if i != 1 else nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ampdiag.diagnose(out=tmp_path, console=False, speed_probe=False, profile=False) as d:
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            loss.backward()
            opt.step()
    assert d.session is not None
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "bad?name" in html and "$\\frac{$" in html
    assert list((tmp_path / "tensorboard" / tmp_path.name).glob("events.out.tfevents.*"))


def long_session(steps: int) -> Session:
    """A session of `steps` steps in every per-step part a renderer draws or tabulates."""
    rows = [
        {"step": i, "total_us": 100.0, "forward_us": 40.0, "backward_us": 60.0}
        for i in range(steps)
    ]
    rank = {
        "rank": 0,
        "activities_in_window": 10,
        "span_us": 1e6,
        "idle_us": 1e5,
        "compute_us": 8e5,
        "non_compute_us": 1e5,
        "idle_share": 0.1,
        "compute_share": 0.8,
        "non_compute_share": 0.1,
        "window": {"kind": "steps"},
        "idle_breakdown": {"host_wait_us": 1.0, "kernel_wait_us": 1.0, "other_us": 1.0},
        "launch_latency": {},
        "kernel_duration": {},
        "communication": {"comm_us": 0},
        "kernel_types": {"gemm": 1.0},
        "top_kernels": [],
        "precision": {
            "by_precision_share": {},
            "tensor_core_share": 0.0,
            "fp32_matmul_share": 0.0,
            "matmul_us": 0.0,
        },
        "steps": [
            {
                "step": i,
                "host_us": 1.0,
                "span_us": 1.0,
                "idle_us": 0.0,
                "compute_us": 1.0,
                "non_compute_us": 0.0,
                "kernels": 3,
            }
            for i in range(steps)
        ],
    }
    return Session(
        steps=[{"index": i, "wall_s": 0.01 + (i % 7) / 1000} for i in range(steps)],
        sections={
            "profiler": {"breakdown": {"steps": rows, "share": {"forward": 0.4, "backward": 0.6}}},
            "scaler": {
                "present": True,
                "history": [
                    {"step": i, "scale": 2.0 ** (16 - i % 5), "skipped": i % 50 == 0}
                    for i in range(steps)
                ],
                "skipped_steps": list(range(0, steps, 50)),
            },
            "timeline": {"ranks": [rank], "summary": {}},
        },
    )


@pytest.mark.slow
def test_a_long_run_renders_in_bounded_time_and_size() -> None:
    """16776 steps (as in #13): charts aggregate, tables cut; loose bounds, not a benchmark."""
    session = long_session(16776)
    analyze(session)
    started = time.perf_counter()
    html = render_html(session)
    took = time.perf_counter() - started
    assert len(html.encode()) < 1_500_000, len(html)
    assert took < 20.0
    assert "<svg" in html
    assert "… and 16726 more steps" in html


def test_charts_aggregate_long_series() -> None:
    chart = charts.line(list(range(100_000)), {"v": [1.0] * 100_000}, "step", "ms", "t")
    assert (
        len(chart.x) <= charts.MAX_POINTS
        and chart.note == "100000 points, neighbors averaged into 300"
    )
    bars = charts.bars([str(i) for i in range(1000)], {"a": [1.0] * 1000}, "ms", "t")
    assert len(bars.labels) <= charts.MAX_BARS and bars.series[0][1][0] == 1.0
    assert len(svg.draw(chart)) < 40_000


def test_a_section_that_cannot_render_costs_only_itself() -> None:
    session = Session(
        steps=[{"index": 0, "wall_s": 0.1}, {"index": 1, "wall_s": 0.1}],
        sections={"memory": {"peak": {"bytes": 10, "by_category": 5}}},  # not a mapping
    )
    html = render_html(session)
    memory = html.split('<section id="memory">')[1].split("</section>")[0]
    assert "could not be rendered" in memory and "AttributeError" in memory
    time_section = html.split('<section id="time">')[1].split("</section>")[0]
    assert "Wall time per step" in time_section and "<svg" in time_section
    assert 'aria-label="step-times"' in time_section


def test_a_report_that_cannot_render_at_all_still_writes_the_findings(tmp_path: Path) -> None:
    odd = Finding("odd-evidence", "high", "Evidence of the wrong shape.", fix="do this")
    odd.evidence = ["not", "a", "mapping"]  # type: ignore[assignment]
    report = write_html(Session(findings=[odd]), tmp_path)
    html = report.read_text(encoding="utf-8")
    assert "The full report could not be rendered" in html
    assert "odd-evidence" in html and "do this" in html
