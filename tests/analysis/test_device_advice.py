"""Advice that knows the GPU: the trace's deviceProperties decide what precision advice may say.

Truth: the compute capability written in each real trace's ``deviceProperties`` (read here with
json, not by ampdiag), and NVIDIA's published capability of each feature: tensor cores from
7.0 (Volta), BF16 and TF32 from 8.0 (Ampere), FP8 from 8.9 (Ada, Hopper).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from ampdiag.analysis import analyze
from ampdiag.analysis import device as D
from ampdiag.render.console import summary
from ampdiag.render.html import render_html
from ampdiag.sources.traces import session_from_traces

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
GP100 = TRACES / "with_gpu_user_annotation" / "step_based_trace_2543932.json.gz"
A100 = TRACES / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"
H800 = TRACES / "deepseek_v3" / "train_rank0_window40ms.json.gz"
BF16_OR_TF32 = re.compile(r"bf16|bfloat16|tf32", re.IGNORECASE)


def _written_capability(path: Path) -> str:
    props = json.loads(gzip.decompress(path.read_bytes()))["deviceProperties"][0]
    return f"{props['computeMajor']}.{props['computeMinor']}"


@pytest.mark.parametrize(
    ("cap", "tc", "bf16", "fp8"),
    [("6.0", False, False, False), ("7.0", True, False, False), ("7.5", True, False, False),
     ("8.0", True, True, False), ("8.6", True, True, False), ("8.9", True, True, True),
     ("9.0", True, True, True), ("10.0", True, True, True)],
)  # fmt: skip
def test_capability_predicates(cap: str, tc: bool, bf16: bool, fp8: bool) -> None:
    env = {"device_type": "cuda", "device_capability": cap}
    assert D.has_tensor_cores(env) is tc
    assert D.runs_bf16(env) is bf16 and D.runs_tf32(env) is bf16
    assert D.runs_fp8(env) is fp8


def test_unknown_capability_is_unknown() -> None:
    for env in ({}, {"device_type": "cpu", "device_capability": "9.0"},
                {"device_type": "cuda", "device_capability": "x"}):  # fmt: skip
        assert D.runs_bf16(env) is None and D.runs_fp8(env) is None


def _session(path: Path):  # type: ignore[no-untyped-def]
    session = session_from_traces(path)
    session.findings = analyze(session)
    return session


def test_pre_ampere_trace_gets_no_bf16_or_tf32_advice() -> None:
    assert _written_capability(GP100) == "6.0"
    session = _session(GP100)
    assert session.environment["device_capability"] == "6.0"
    assert session.environment["bf16_supported"] is False
    ids = {f.id for f in session.findings}
    assert "fp32-kernels-dominant" in ids  # the finding stays: its GEMMs are FP32
    for f in session.findings:
        assert not BF16_OR_TF32.search(f.title), f.id
        assert not BF16_OR_TF32.search(str(f.fix)), f.id
    fp32 = next(f for f in session.findings if f.id == "fp32-kernels-dominant")
    assert "Quadro GP100 (sm_60)" in fp32.title and "no tensor cores" in fp32.title
    assert "float16" in str(fp32.fix) and "GradScaler" in str(fp32.fix)
    assert "Quadro GP100 (sm_60)" in summary(session)  # the report names the GPU
    assert "Quadro GP100 (sm_60)" in render_html(session)


def test_ampere_trace_keeps_its_tf32_advice() -> None:
    assert _written_capability(A100) == "8.0"
    session = _session(A100)
    fp32 = [f for f in session.findings if f.id == "fp32-kernels-dominant"]
    assert fp32 and "allow_tf32" in str(fp32[0].fix) and "bfloat16" in str(fp32[0].fix)


def test_hopper_capability_is_read() -> None:
    assert _written_capability(H800) == "9.0"
    env = session_from_traces(H800).environment
    assert env["device_capability"] == "9.0" and D.runs_fp8(env) is True
