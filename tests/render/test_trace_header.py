"""A trace's header states its profiled steps and the precisions its kernels ran in.

Truth: the ``ProfilerStep#N`` events and the kernel names of the raw JSON, counted here with
json; the precision of a kernel read from its name's dtype words by this test (``fp8`` in the
DeepSeek-V3 FP8 GEMMs, ``float``/``sgemm`` in the A100 CNN's kernels).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ampdiag.analysis import analyze
from ampdiag.render.console import summary
from ampdiag.render.html import render_html
from ampdiag.sources.traces import session_from_traces

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
DEEPSEEK = TRACES / "deepseek_v3" / "train_rank0_window40ms.json.gz"
CNN = TRACES / "nccl_parser_config" / "nccl_data.json.gz"


def _steps(path: Path) -> list[float]:
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [float(e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]


def _header(path: Path) -> tuple[str, str]:
    session = session_from_traces(path)
    session.findings = analyze(session)
    return summary(session).splitlines()[0], render_html(session)


def test_deepseek_header_states_its_step_and_fp8() -> None:
    steps = _steps(DEEPSEEK)
    assert len(steps) == 1 and steps[0] == 112202.0
    line, html = _header(DEEPSEEK)
    assert "1 profiled step (112.20 ms)" in line and "0 steps" not in line
    assert "NVIDIA H800 (sm_90)" in line
    kernels = re.search(r"kernels in (.*)$", line)
    assert kernels is not None and kernels.group(1).startswith("fp8 ")
    assert "autocast off" not in line  # a trace has no autocast setting to state
    assert "1 profiled step" in html and "kernels in fp8" in html


def test_multi_step_trace_header_states_count_and_times() -> None:
    steps = _steps(CNN)
    line, _ = _header(CNN)
    m = re.search(r"(\d+) profiled steps \(median ([\d.]+) ms", line)
    assert m is not None
    assert int(m.group(1)) == len(steps) >= 2
    durs = sorted(steps)
    median = (durs[(len(durs) - 1) // 2] + durs[len(durs) // 2]) / 2 / 1000
    assert float(m.group(2)) == pytest.approx(median, abs=0.01)
    assert "kernels in fp32" in line and "tf32" in line
