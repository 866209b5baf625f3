"""The speed probe: FP32 vs autocast times measured on the user's model, changing nothing."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampdiag
from ampdiag.analysis import analyze
from ampdiag.analysis.rules.autocast_speed import THRESHOLDS
from ampdiag.session import Finding, Session
from ampdiag.sources.live.collectors.speed_probe import probe_figures
from ampdiag.sources.live.compare import compare
from tests.collectors.helpers import Spin
from tests.scenarios.harness import one_thread

QUIET = {"profile": False, "report": False, "tensorboard": False, "console": False}


def matmul_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])


def train(
    model: nn.Module, data: list[torch.Tensor], dtype: torch.dtype, out: Path | None, **kw: int
):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps() -> None:
        for x in data:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=dtype):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()

    if out is None:
        steps()
        return None
    with ampdiag.diagnose(out=out, **QUIET, **kw) as d:
        steps()
    return d.session


@pytest.fixture(name="one_thread")
def one_thread_fixture() -> Iterator[None]:
    # one thread makes both timings (probe and direct) comparable on a shared machine
    with one_thread():
        yield


def test_speed_probe_measures_both_precisions_on_a_real_run(tmp_path: Path, one_thread) -> None:
    # Timings are too noisy on a shared CI machine to assert which precision wins (that is
    # measured in benchmarks); what a user relies on is that both are measured on the run's
    # own batch and that the finding reports exactly those numbers, by the documented threshold.
    torch.manual_seed(1)
    data = [torch.randn(64, 256) for _ in range(3)]
    model = matmul_model()
    session = train(model, data, torch.float16, tmp_path / "run", speed_probe_repeats=5)
    probe = session.section("speed_probe")
    assert probe["autocast"] == "cpu:float16"
    assert probe["batch_size"] == 64
    assert probe["measured"] == "forward + backward"
    # one timing of each precision, stated once: the probe's samples are the A/B's rows'
    rows = {r["precision"]: r for r in probe["precisions"]["results"]}
    assert probe["fp32_ms_all"] == rows["fp32"]["times_ms"]
    assert probe["autocast_ms_all"] == rows["fp16"]["times_ms"]
    # three rounds at least whatever the budget while racing (a spread), five where the budget
    # allows; one whose first pass is 2x the other's least pass leaves the race after it
    fp32_n, low_n = len(probe["fp32_ms_all"]), len(probe["autocast_ms_all"])
    assert min(fp32_n, low_n) == probe["repeats"] and max(fp32_n, low_n) >= 3
    if probe["repeats"] == 1:
        slow, fast = ("fp16", "fp32") if low_n == 1 else ("fp32", "fp16")
        assert rows[slow]["times_ms"][0] >= 2 * min(rows[fast]["times_ms"])
        assert rows[slow]["one_round"] >= 2
    # each figure is the least pass (another process only adds time)
    assert probe["fp32_ms"] == pytest.approx(min(probe["fp32_ms_all"]), abs=1e-3)
    assert probe["autocast_ms"] == pytest.approx(min(probe["autocast_ms_all"]), abs=1e-3)
    assert probe["fp32_ms_spread"] >= 0 and probe["autocast_ms_spread"] >= 0
    ratio = probe["autocast_ms"] / probe["fp32_ms"]
    assert probe["ratio"] == pytest.approx(ratio, rel=1e-3)
    assert probe["ratio_low"] <= probe["ratio"] <= probe["ratio_high"]
    names = {m["module"] for m in probe["modules"]}
    assert names <= {"0", "1", "2", "3"} and names
    session.findings = analyze(session)
    found = [f for f in session.all_findings() if f.id == "autocast-slower"]
    threshold = THRESHOLDS.slowdown_medium
    # the A/B's least version runs on every run: where it timed both precisions its least
    # times are the ones the finding states, the interval reaching the second-least passes
    rows = {r["precision"]: r for r in (probe.get("precisions") or {}).get("results", [])}
    if all(len(rows.get(p, {}).get("times_ms") or []) >= 2 for p in ("fp32", "fp16")):
        a, b = sorted(rows["fp16"]["times_ms"]), sorted(rows["fp32"]["times_ms"])
        ratio, low, high = a[0] / b[0], a[0] / b[1], a[1] / b[0]
        probe = {**probe, "ratio_low": low, "ratio_high": high, "fp32_ms": b[0],
                 "autocast_ms": a[0]}  # fmt: skip
    if probe["ratio_high"] < threshold:
        assert not found
    else:
        (f,) = found
        ev = f.evidence
        assert ev["slowdown"] == pytest.approx(ratio, rel=1e-3)
        assert ev["slowdown_low"] == pytest.approx(probe["ratio_low"], abs=1e-3)
        if probe["ratio_low"] < threshold:  # the interval straddles it: uncertain
            assert f.severity == "info" and "straddles" in ev["uncertain"]
        else:
            assert ev["fp32_ms"] == pytest.approx(probe["fp32_ms"], rel=1e-6)
            assert ev["autocast_ms"] == pytest.approx(probe["autocast_ms"], rel=1e-6)
            assert ev["estimated_fp32_step_ms"] < ev["step_ms"]
            # the fix follows the precision A/B (a switch, or why it did not measure one)
            assert "precision A/B" in f.fix
            assert "enabled=use_amp" in f.fix or "dtype=torch.bfloat16" in f.fix


def test_training_is_bit_identical_with_the_probe(tmp_path: Path) -> None:
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4)
        )

    torch.manual_seed(5)
    data = [torch.randn(8, 16) for _ in range(3)]
    plain, watched = model(), model()
    torch.manual_seed(7)
    train(plain, data, torch.bfloat16, None)
    after_plain = torch.get_rng_state()
    torch.manual_seed(7)
    session = train(watched, data, torch.bfloat16, tmp_path / "run")
    after_watched = torch.get_rng_state()
    assert session.section("speed_probe")["fp32_ms"] > 0  # the probe did run
    assert torch.equal(after_plain, after_watched)
    for a, b in zip(plain.state_dict().values(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)  # .grad untouched by the probe's backward
    # And training on after the block stays identical (dropout draws, BN statistics).
    torch.set_rng_state(after_plain)
    train(plain, data[:1], torch.bfloat16, None)
    torch.set_rng_state(after_watched)
    train(watched, data[:1], torch.bfloat16, None)
    for a, b in zip(plain.state_dict().values(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_probe_skips_after_an_error_and_without_autocast(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError), ampdiag.diagnose(out=tmp_path / "err", **QUIET) as d:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(2, 4)).sum().backward()
        raise ValueError("user error")
    assert "raised" in d.session.section("speed_probe")["skipped"]
    with ampdiag.diagnose(out=tmp_path / "fp32", **QUIET) as d:
        model(torch.randn(2, 4)).sum().backward()
    probe = d.session.section("speed_probe")
    assert "autocast" in probe["skipped"] and "fp32_ms" not in probe
    off = ampdiag.diagnose(out=tmp_path / "off", speed_probe=False, **QUIET)
    with off as d, torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 4)).sum().backward()
    assert "disabled" in d.session.section("speed_probe")["skipped"]


def probe_session(fp32: list[float], amp: list[float]) -> Session:
    return Session(
        environment={"device_type": "cpu", "bf16_native": False, "cpu_flags": ["avx2"]},
        steps=[{"index": i, "wall_s": 0.05} for i in range(4)],
        sections={
            "speed_probe": {
                "autocast": "cpu:bfloat16",
                "fp32_ms": statistics.median(fp32),
                "autocast_ms": statistics.median(amp),
                "fp32_ms_all": fp32,
                "autocast_ms_all": amp,
                "repeats": len(fp32),
                "measured": "forward + backward",
                "modules": [{"module": "<b>x</b>", "fp32_ms": 1.0, "autocast_ms": 4.0}],
            }
        },
    )


def slower(fp32: list[float], amp: list[float]) -> list[Finding]:
    """The autocast-slower finding, standing alone or merged into the precision advice."""
    session = probe_session(fp32, amp)
    session.findings = analyze(session)
    return [f for f in session.all_findings() if f.id == "autocast-slower"]


TEN = [10.0, 10.1, 9.9, 10.0, 10.2]


def test_autocast_slower_thresholds_from_constructed_sessions() -> None:
    assert not slower(TEN, [6.0] * 5)
    assert not slower(TEN, [10.5, 10.4, 10.6, 10.5, 10.5])
    (medium,) = slower(TEN, [12.0, 12.1, 11.9, 12.0, 12.2])
    assert medium.severity == "medium"
    # 4x slower is the same severity (a measured speed's size moves between identical runs),
    # said in its figures
    (far,) = slower(TEN, [40.0] * 5)
    assert far.severity == "medium" and "4.04x" in far.title
    # the step at the ratio of the least passes: 50 ms x 9.9 / 40
    assert far.evidence["step_ms"] == 50.0 and far.evidence["estimated_fp32_step_ms"] == 12.375
    assert far.evidence["slowest_modules"] == ["<b>x</b>: 1.00 ms -> 4.00 ms"]
    assert far.evidence["pairs"] == 5
    assert "AVX512_BF16" in far.fix


def test_autocast_slower_compares_the_interval_not_one_sample() -> None:
    # one stalled FP32 pass among five moves neither least time nor interval: still medium
    (medium,) = slower([10.0, 10.0, 10.1, 9.9, 150.0], [12.0, 12.1, 11.9, 12.0, 12.0])
    assert medium.severity == "medium"
    # FP32 passes [151, 24, 112] ms (the issue's, one of them 112): autocast's least pass (118)
    # is not 1.10x FP32's second least, its second least 5x FP32's least: uncertain
    (noisy,) = slower([151.0, 24.0, 112.0], [120.0, 118.0, 125.0])
    assert noisy.severity == "info" and "straddles" in noisy.evidence["uncertain"]
    assert noisy.evidence["slowdown_low"] < 1.1 < noisy.evidence["slowdown_high"]
    # a single pair gives no interval
    (single,) = slower([10.0], [40.0])
    assert single.severity == "info" and "single" in single.evidence["uncertain"]


class _LinearDtypes(torch.overrides.TorchFunctionMode):
    """Counts the dtype of every ``F.linear`` result: what the probe's passes really ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.nn.functional.linear:
            self.dtypes.append(out.dtype)
        return out


def _probe(model: nn.Module, x: torch.Tensor, dtype: torch.dtype, **kw: Any) -> dict[str, Any]:
    """The probe's figures as a run gets them: the A/B of FP32 and the run's precision."""
    own = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    found = compare(model, x, precisions=["fp32", own], keep=own, **kw).to_dict()
    return probe_figures(found, own)


def test_probe_autocast_passes_run_in_the_low_dtype(one_thread) -> None:
    # Truth outside the probe's own samples: a function mode counts what each linear returned.
    # Four layers; per precision one observed pass, its timed passes (FP32 three: tolerance=inf
    # stops at the requested rounds; BF16 one where this CPU emulates it 2x slower or more,
    # and it leaves the race) and the per-module forwards: BF16's two (times, casts) where it
    # was not measured faster, and then FP32's one (times); none where it was.
    model, x = matmul_model(), torch.randn(8, 256)
    with _LinearDtypes() as seen:
        out = _probe(model, x, torch.bfloat16, min_samples=3, tolerance=math.inf)
    timed = {"fp32": len(out["fp32_ms_all"]), "bf16": len(out["autocast_ms_all"])}
    # three, or up to six where the two rest on the 1.10x bar (`compare.NEAR_BAR`)
    assert 3 <= timed["fp32"] <= 6 and 1 <= timed["bf16"] <= 6, timed
    faster = out["ratio_high"] <= 1  # BF16 measured faster: its whole interval at most 1x
    assert seen.dtypes.count(torch.bfloat16) == 4 * (1 + timed["bf16"] + (0 if faster else 2))
    assert seen.dtypes.count(torch.float32) == 4 * (1 + timed["fp32"] + (0 if faster else 1))
    assert len(seen.dtypes) == 4 * (2 + timed["fp32"] + timed["bf16"] + (0 if faster else 3))


def _own_ratio(
    model: nn.Module, x: torch.Tensor, dtype: torch.dtype, pairs: int
) -> tuple[float, float]:
    """Autocast / FP32 forward+backward time, timed by the test itself (ABBA): the ratio of the
    wall-clock medians and that of the thread's CPU-time medians (one thread: the same work).
    On a busy machine the two part: a long pass is preempted more often than a short one."""
    params = list(model.parameters())

    def once(amp: bool) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        with torch.autocast("cpu", dtype=dtype, enabled=amp):
            loss = model(x).float().sum()
        torch.autograd.grad(loss, params)
        return time.perf_counter() - t0, time.thread_time() - c0

    once(False), once(True)
    fp32: list[tuple[float, float]] = []
    amp: list[tuple[float, float]] = []
    for i in range(pairs):
        for on in (False, True) if i % 2 == 0 else (True, False):
            (amp if on else fp32).append(once(on))

    def median(xs: list[tuple[float, float]], k: int) -> float:
        return statistics.median(x[k] for x in xs)

    return median(amp, 0) / median(fp32, 0), median(amp, 1) / max(median(fp32, 1), 1e-9)


def test_probe_ratio_agrees_with_the_tests_own_clock(one_thread) -> None:
    # Low-precision autocast on a CPU without native FP16/BF16 units is emulated: several times
    # slower than FP32 (measured 4-10x for FP16 on a 256-wide MLP on an AMD EPYC). The test times
    # the same passes itself; the probe's ratio must land near it -- a probe whose "autocast"
    # passes ran in FP32 measures about 1x. That tells the two apart only where the dtype is
    # slow (CPU time): a CPU with AMX or AVX512-FP16 runs it at about FP32's speed, and the
    # test then tries the other dtype, and skips with the measured ratios when neither is slow.
    # The probe times wall clock: the comparison holds only where the test's own wall-clock and
    # CPU-time ratios agree (a quiet enough machine); otherwise it skips with the figures.
    model, x = matmul_model(), torch.randn(64, 256)
    measured = {}
    for dtype in (torch.float16, torch.bfloat16):
        wall, cpu = _own_ratio(model, x, dtype, pairs=5)
        measured[str(dtype)] = round(cpu, 2)
        if cpu > 2.5:
            break
    else:
        pytest.skip(f"the premise, a slow low-precision dtype on this CPU, fails: {measured}")
    out = _probe(model, x, dtype, min_samples=5, budget_s=20.0)
    own = [wall, cpu, *_own_ratio(model, x, dtype, pairs=5)]  # the load may change meanwhile
    if max(own) > 2 * min(own):
        pytest.skip(f"too busy a machine for a wall-clock ratio: own wall, CPU ratios {own}")
    assert min(own) / 2.5 < out["ratio"] < max(own) * 2.5, (out["ratio"], own)


def test_probe_repeats_until_tight_within_its_budgets(one_thread: None) -> None:
    # BF16 1.7x slower than FP32, known beforehand: as far from the 1.37x where a claim rests
    # on the bar (more rounds than asked for, `test_compare`) as from the 2x that puts one out
    # of the race, in a ratio: 20% of load on either time moves neither
    model, x = Spin(4.0, 6.8), torch.randn(4, 4)

    def rounds(**kw: Any) -> int:
        # FP32's rounds: a precision 2x slower after a round leaves the rounds (`compare`)
        out = _probe(model, x, torch.bfloat16, **kw)
        assert out["repeats"] == min(len(out["fp32_ms_all"]), len(out["autocast_ms_all"])) >= 1
        return len(out["fp32_ms_all"])

    # any spread is tight enough: stop at the requested rounds
    assert rounds(min_samples=5, tolerance=math.inf, budget_s=60.0) == 5
    # nothing is tight enough: more rounds only while the budget lasts
    assert rounds(min_samples=3, tolerance=0.0, budget_s=0.3) > 3
    # the budget is spent: three rounds still, so that every figure has a spread that one
    # stalled sample cannot move
    assert rounds(min_samples=5, budget_s=0.0) == 3
