"""TensorBoard output read back by a real ``tensorboard`` server over its HTTP API."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ampdiag import units
from ampdiag.render.tensorboard import write_tensorboard
from ampdiag.session import Finding, Session

RUN = "run"  # the run is named after the output folder (out/tensorboard/run/)
DEADLINE_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}" + (("?" + urllib.parse.urlencode(params)) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode("utf-8"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, evil_run: Session) -> Iterator[tuple]:
    """A tensorboard server on the evil run's folder, with extra findings written too."""
    assert evil_run.path is not None
    out = tmp_path_factory.mktemp("tb") / "run"
    session = Session.from_dict(evil_run.to_dict())
    session.findings.append(
        Finding(
            "fp16-grad-underflow",
            "high",
            "31% of gradients underflow",
            {"underflow_fraction": 0.31, "recommended_init_scale": 2.0**20},
            fix="scaler = torch.amp.GradScaler('cuda', init_scale=2.0**20)",
        )
    )
    session.sections["scaler"] = {
        "history": [{"step": i, "scale": 2.0 ** (16 - i), "skipped": i < 2} for i in range(4)]
    }
    write_tensorboard(session, out)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(out / "tensorboard"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast=false",
            "--reload_interval=1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"tensorboard exited with {proc.returncode}: {err[-2000:]}")
            try:
                tags = get_json(base, "/data/plugin/scalars/tags")
                if RUN in tags and "step/wall_time_ms" in tags[RUN]:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("tensorboard did not serve the scalars in time")
            time.sleep(0.5)
        yield base, session
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


def scalars(base: str, tag: str) -> list[tuple[int, float]]:
    rows = get_json(base, "/data/plugin/scalars/scalars", run=RUN, tag=tag)
    return [(int(step), float(value)) for _, step, value in rows]


def test_scalars_read_back_equal_the_session(served: tuple) -> None:
    base, session = served
    walls = scalars(base, "step/wall_time_ms")
    assert [s for s, _ in walls] == [s["index"] for s in session.steps]
    for (_, got), step in zip(walls, session.steps, strict=True):
        assert got == pytest.approx(step["wall_s"] * 1000, rel=1e-6)
    scale = scalars(base, "scaler/loss_scale")
    assert [v for _, v in scale] == [65536.0, 32768.0, 16384.0, 8192.0]
    assert [v for _, v in scalars(base, "scaler/skipped")] == [1.0, 1.0, 0.0, 0.0]


def test_each_scalar_is_a_per_step_curve_with_a_description(served: tuple) -> None:
    base, _ = served
    tags = get_json(base, "/data/plugin/scalars/tags")[RUN]
    # figures measured once are text, not one-point curves; the scale and skips once each
    assert not [
        t
        for t in tags
        if t.split("/")[0]
        in ("summary", "speed_probe", "time_share", "memory", "precision", "timeline")
    ]
    assert [t for t in tags if t.endswith("loss_scale")] == ["scaler/loss_scale"]
    for tag, info in tags.items():
        assert info["description"].strip(), tag  # TensorBoard shows it beside the chart
        assert len(scalars(base, tag)) >= 2, tag


def test_one_off_figures_are_a_text_table_of_the_sessions_values(served: tuple) -> None:
    base, session = served
    rows = get_json(base, "/data/plugin/text/text", run=RUN, tag="summary/figures/text_summary")
    text = rows[0]["text"]
    walls = [s["wall_s"] for s in session.steps][1:]  # 3 steps: the first left out
    median_ms = statistics.median(walls) * 1000

    assert units.micros(median_ms * 1000) in text  # the step time the report states
    # FP32's time: the precision A/B's where it timed FP32 and the run's BF16, else the probe's
    probe = session.section("speed_probe")
    rows_ab = {r["precision"]: r for r in (probe.get("precisions") or {}).get("results") or []}
    timed = all((r := rows_ab.get(p) or {}).get("samples", 0) >= 2 or r.get("one_round")
                for p in ("fp32", "bf16"))  # fmt: skip
    fp32_ms = rows_ab["fp32"]["time_ms"] if timed else probe["fp32_ms"]
    assert f"FP32 {units.micros(fp32_ms * 1000)}" in text


def test_findings_text_and_figures_read_back(served: tuple) -> None:
    base, _ = served
    # torch's SummaryWriter.add_text stores tag T as "T/text_summary".
    tags = get_json(base, "/data/plugin/text/tags")[RUN]
    assert "ampdiag/findings/text_summary" in tags
    table = get_json(base, "/data/plugin/text/text", run=RUN, tag="ampdiag/findings/text_summary")
    assert "fp16-grad-underflow" in table[0]["text"]
    one = get_json(
        base, "/data/plugin/text/text", run=RUN, tag="findings/fp16-grad-underflow/text_summary"
    )
    assert "init_scale=2.0**20" in one[0]["text"] and "31.0%" in one[0]["text"]
    # no images: TensorBoard draws the per-step figures from the scalars
    assert get_json(base, "/data/plugin/images/tags").get(RUN, {}) == {}


def test_tensorboard_output_without_optional_data(tmp_path: Path) -> None:
    folder = write_tensorboard(Session(), tmp_path)
    assert list(folder.glob("events.out.tfevents.*"))


def test_histograms_and_step_breakdown_read_back_by_tensorboards_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing import event_accumulator

    steps = [{"index": i, "wall_s": 0.01 * (i + 1)} for i in range(4)]
    session = Session(steps=steps)  # type: ignore[arg-type]
    session.sections["gradients"] = {"hist_held": {"-3": 5, "0": 2}}
    breakdown = {
        "share": {"forward": 0.6, "backward": 0.4},
        "steps": [
            {"step": 2, "forward_us": 3000.0, "backward_us": 2000.0},
            {"step": 3, "forward_us": 3500.0, "backward_us": 1500.0},
        ],
    }
    session.sections["profiler"] = {"breakdown": breakdown}
    folder = write_tensorboard(session, tmp_path)
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"images": 0})
    acc.Reload()
    assert acc.Tags()["images"] == []
    # each profiled step's host time per category, in ms, at that step
    fwd = [(e.step, e.value) for e in acc.Scalars("time/forward_ms")]
    bwd = [(e.step, e.value) for e in acc.Scalars("time/backward_ms")]
    assert fwd == [(2, 3.0), (3, 3.5)] and bwd == [(2, 2.0), (3, 1.5)]
    (h,) = acc.Histograms("numerics/log2_grad_held")
    # counted by hand: 5 values in [-3, -2), 2 in [0, 1)
    assert h.histogram_value.num == 7 and h.histogram_value.sum == -15.0
    assert list(h.histogram_value.bucket_limit) == [-2.0, 1.0]
    assert list(h.histogram_value.bucket) == [5.0, 2.0]
