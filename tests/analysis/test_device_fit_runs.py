"""Fixes fit the device, on sessions of real runs: the code names the run's device, and a GPU
below compute capability 8.0 is never told to use BF16 or TF32.

Each session is a real CPU run of the scenario corpus (FP16 trouble of several kinds, BF16
weights, autocast around the loss only, a memory budget no micro-batch fits), then moved to
another device the way its environment would record it: device type, compute capability,
and ``bf16_supported`` as ``torch.cuda.is_bf16_supported()`` says it (True on every CUDA GPU,
which emulates BF16 below 8.0), the autocast and scaler states named for that device. Truth
is the device set here and what it runs (NVIDIA's compute-capability tables: BF16 and TF32
tensor cores from 8.0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from ampdiag.analysis import analyze
from ampdiag.session import Finding, Session
from tests.scenarios.harness import all_scenarios

#: Corpus runs whose findings carry device code and precision advice.
RUNS = (
    "underflow-no-scale-reaches",  # FP16, no loss scale works: BF16 is the fix where it runs
    "underflow-partial-no-scaler",  # FP16 without a GradScaler
    "loss-scale-collapse",
    "activation-overflow-fp16",
    "lowprec-bf16-weights",
    "autocast-only-loss",
    "no-micro-batch-fits",
)
#: device type, compute capability, GPU name.
DEVICES = {
    "cpu": ("cpu", None, None),
    "pascal": ("cuda", "6.1", "Tesla P40"),
    "volta": ("cuda", "7.0", "Tesla V100-SXM2-16GB"),
    "ampere": ("cuda", "8.0", "NVIDIA A100-SXM4-40GB"),
}
#: Device code in a fix: the device type it names.
DEVICE_CODE = re.compile(
    r"autocast\(\s*(?:device_type=)?['\"](\w+)['\"]|GradScaler\(\s*['\"](\w+)['\"]"
    r"|\.to\(\s*['\"](\w+)['\"]"
)
#: Code that computes in BF16 or turns TF32 on.
LOW_CODE = re.compile(r"torch\.bfloat16|allow_tf32|bf16_compress_hook")


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The runs' sessions as saved (JSON), by scenario name."""
    by_name = {s.name: s for s in all_scenarios()}
    out: dict[str, dict[str, Any]] = {}
    for name in RUNS:
        session, _ = by_name[name].run(tmp_path_factory.mktemp(name) / "run")
        assert session.environment["device_type"] == "cpu"
        out[name] = json.loads(json.dumps(session.to_dict()))
    return out


def moved(doc: dict[str, Any], device: str) -> Session:
    """The session as the same run on ``device`` would record it, analysed afresh."""
    kind, cap, name = DEVICES[device]
    text = json.dumps(doc)
    if kind == "cuda":  # the autocast states ("cpu:float16"), the scaler's and audit's device
        text = text.replace('"cpu:', '"cuda:').replace('"device": "cpu"', '"device": "cuda"')
        text = text.replace('"device_type": "cpu"', '"device_type": "cuda"')
    data = json.loads(text)
    env = data["environment"]
    env["device_type"] = kind
    if kind == "cuda":
        env.update(device_capability=cap, device_name=name, bf16_supported=True)
        env.pop("bf16_native", None)
    data["findings"] = []
    session = Session.from_dict(data)
    session.findings = analyze(session)
    return session


def _fixes(session: Session) -> Iterator[Finding]:
    yield from (f for f in session.all_findings() if f.fix)


def _devices_named(fix: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in DEVICE_CODE.finditer(fix)}


@pytest.mark.slow  # seven diagnosed runs
@pytest.mark.parametrize("device", list(DEVICES))
def test_fix_code_names_the_runs_device(sessions: dict[str, Any], device: str) -> None:
    kind = DEVICES[device][0]
    named = 0
    for doc in sessions.values():
        session = moved(doc, device)
        for f in _fixes(session):
            devices = _devices_named(f.fix or "")
            assert devices <= {kind}, (device, f.id, f.fix)
            named += bool(devices)
    assert named >= len(sessions)  # not vacuous: most fixes carry device code


@pytest.mark.slow
@pytest.mark.parametrize("device", ["pascal", "volta"])
def test_no_bf16_or_tf32_advice_below_capability_8(sessions: dict[str, Any], device: str) -> None:
    for doc in sessions.values():
        session = moved(doc, device)
        for f in session.all_findings():
            assert f.id != "prefer-bf16", (device, f.title)
            assert f.evidence.get("precision") not in ("bf16", "tf32"), (device, f.id, f.title)
            assert not LOW_CODE.search(f.fix or ""), (device, f.id, f.fix)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "ampere"])
def test_bf16_advice_stays_where_the_device_runs_it(sessions: dict[str, Any], device: str) -> None:
    """The control: the same runs on a device with BF16 are advised BF16 somewhere."""
    advised = [
        f.id
        for doc in sessions.values()
        for f in moved(doc, device).all_findings()
        if f.id == "prefer-bf16" or "torch.bfloat16" in (f.fix or "")
    ]
    assert advised, device
