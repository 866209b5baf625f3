"""One number per quantity: every surface states the same value of each figure of a run.

Real runs (notebook 01's FP16 run without and with a GradScaler, the underflow demo's model,
a NaN made in the backward, an FP16 run with a GradScaler and a NaN, the BF16 demo) are
rendered to every surface: the HTML report, the console, the JSON session, TensorBoard (read
back with TensorBoard's own ``EventAccumulator``), the diff page and the notebook's inline diff.
From each, the statements of a quantity are pulled out of the text (step time, underflow share,
skipped steps, loss scale, the first inf/NaN step, memory peak, the speed against FP32) and
compared with the truth read from the session's raw sections, not through ampdiag's figures:
the step walls, the scaler's totals, the memory peak, the A/B's or the probe's medians, the
``nonfinite-origin`` finding (the analysis' one answer) -- to the surface's displayed rounding.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ampdiag import units
from ampdiag.analysis.diff import diff_sessions
from ampdiag.render.console import summary
from ampdiag.render.diff import diff_html, diff_text
from ampdiag.render.html import render_html
from ampdiag.render.tensorboard import write_tensorboard
from ampdiag.session import Session

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "01_diverging_fp16.ipynb"


def text_of(page: str) -> str:
    """A page's visible text: no style, script or raw-values block; tags to spaces."""
    for tag in ("style", "script"):
        page = re.sub(rf"<{tag}\b.*?</{tag}>", " ", page, flags=re.S)
    page = re.sub(r'<details class="raw">.*?</details>', " ", page, flags=re.S)
    page = re.sub(r"<sup>(-?\d+)</sup>", r"^\1", page)
    page = re.sub(r"<[^>]+>", " ", page)
    return re.sub(r"\s+", " ", html_lib.unescape(page))


# --- the truth, read from the session's raw sections -------------------------------------


def true_step_s(doc: dict[str, Any]) -> float:
    walls = [s["wall_s"] for s in doc["steps"] if isinstance(s.get("wall_s"), (int, float))]
    return statistics.median(walls[1:] if len(walls) >= 3 else walls)


def true_skips(doc: dict[str, Any]) -> tuple[int, int] | None:
    sc = doc.get("scaler") or {}
    if not sc.get("present"):
        return None
    return int(sc["skipped_total"]), int(sc["steps_total"])


def finding(doc: dict[str, Any], fid: str) -> dict[str, Any] | None:
    for f in doc["findings"]:
        for g in [f, *(f["evidence"].get("merged") or [])]:
            if g["id"] == fid:
                return g  # type: ignore[no-any-return]
    return None


def true_speed(doc: dict[str, Any]) -> tuple[float, str] | None:
    """The run's time over FP32's, with where it was measured: the A/B where it timed both.

    Timed: two passes or more, or one round (a precision 2x slower after its first pass).
    """
    probe = doc.get("speed_probe") or {}
    run = {"float16": "fp16", "bfloat16": "bf16"}.get(str(probe.get("autocast")).split(":")[-1])
    rows = {r["precision"]: r for r in (probe.get("precisions") or {}).get("results") or []}
    a, b = rows.get(run or ""), rows.get("fp32")
    timed = [r for r in (a, b) if r and (r.get("samples", 0) >= 2 or r.get("one_round"))]
    if len(timed) == 2 and a and b:  # a precision timed in one round: its one pass
        return a["time_ms"] / b["time_ms"], "precision A/B"
    if isinstance(probe.get("fp32_ms"), (int, float)):
        f, g = probe["fp32_ms_all"], probe["autocast_ms_all"]
        return min(g) / min(f), "speed probe"  # the least passes (ampdiag.timing.least)
    return None


# --- the runs ------------------------------------------------------------------------------


def _notebook_runs(out: Path) -> tuple[Session, Session]:
    """Notebook 01's own training code (its first code cell), its FP16 runs."""
    import torch

    nb = json.loads(NOTEBOOK.read_text("utf-8"))
    code = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    scope: dict[str, Any] = {}
    exec(compile(code, str(NOTEBOOK), "exec"), scope)  # defines train(), OUT
    scope["OUT"] = out
    fp16 = scope["train"]("tutorial-fp16", torch.float16)
    scaled = scope["train"](
        "tutorial-fp16-scaler", torch.float16, scaler=torch.amp.GradScaler("cpu", init_scale=2048)
    )
    return fp16.session, scaled.session


def _scenario(name: str, out: Path) -> Session:
    import importlib

    module = importlib.import_module(f"tests.scenarios.{name}")
    session, _ = module.SCENARIO.run(out)
    session.save(out)
    return session  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Session]:
    from ampdiag import load
    from ampdiag.demo import run_demo

    root = tmp_path_factory.mktemp("one-number")
    fp16, scaled = _notebook_runs(root / "nb")
    out: dict[str, Session] = {"notebook-fp16": fp16, "notebook-fp16-scaler": scaled}
    for name in ("sc_underflow_demo", "sc_nan_backward_early", "sc_nan_forward_fp16_scaler"):
        out[name] = _scenario(name, root / name)
    out["bf16-demo"] = load(run_demo(root / "bf16-demo", scenario="amp", dtype="bfloat16"))
    return out


@pytest.fixture(scope="module")
def surfaces(runs: dict[str, Session], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per run: its JSON document and the text of every surface."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = tmp_path_factory.mktemp("tb")
    out: dict[str, dict[str, Any]] = {}
    for name, session in runs.items():
        folder = write_tensorboard(session, root / name)
        acc = EventAccumulator(str(folder))
        acc.Reload()
        texts = {
            t.removesuffix("/text_summary"): acc.Tensors(t)[0].tensor_proto.string_val[0].decode()
            for t in acc.Tags()["tensors"]
        }
        out[name] = {
            "doc": json.loads(json.dumps(session.to_dict(), default=str)),
            "html": text_of(render_html(session)),
            "console": re.sub(r"\s+", " ", summary(session)),
            "tb_text": texts,
            "tb": acc,
        }
    return out


def pairs(surfaces: dict) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from surfaces.items()


# --- the checks ----------------------------------------------------------------------------


def test_step_time_is_one_number(surfaces: dict) -> None:
    for name, s in pairs(surfaces):
        want = units.micros(true_step_s(s["doc"]) * 1e6)
        assert f"median {want} per step" in s["html"], name  # the overview's header
        assert f"| Step time (median) | {want}" in s["tb_text"]["summary/figures"], name
        assert s["doc"]["derived"]["figures"]["step_time"]["median_s"] == pytest.approx(
            true_step_s(s["doc"])
        ), name
        # every other statement of the step time in the page is the same number
        stated = re.findall(r"Step time (?:\(median\) )?([\d.,]+ (?:µs|ms|s))\b", s["html"])
        assert set(stated) <= {want}, (name, stated)


def test_underflow_share_is_one_number(surfaces: dict) -> None:
    seen = 0
    for name, s in pairs(surfaces):
        f = finding(s["doc"], "fp16-grad-underflow")
        if f is None:
            continue
        seen += 1
        want = units.percent(f["evidence"]["underflow_fraction"])
        assert f["title"].startswith(f"{want} of nonzero"), name
        # the numerics table, the TensorBoard table, the JSON figure
        assert f"(zero or subnormal in FP16) {want}" in s["html"], name
        assert f"| Gradient underflow (FP16) | {want} |" in s["tb_text"]["summary/figures"], name
        assert s["doc"]["derived"]["figures"]["underflow_fraction"] == pytest.approx(
            f["evidence"]["underflow_fraction"]
        ), name
        stated = set(re.findall(r"(\d+\.\d)% of nonzero gradient values", s["html"]))
        assert stated == {want.rstrip("%")}, (name, stated)
    assert seen >= 2  # notebook 01's FP16 run and the demo's model


def test_the_notebook_and_diff_state_the_findings_underflow(
    runs: dict[str, Session], surfaces: dict, tmp_path: Path
) -> None:
    # notebook 01 printed 59.2% from the finding and showed 34.5% in the diff of the same run
    from ampdiag.render.notebook import diff_inline  # the notebook's own display of a diff

    before, after = runs["notebook-fp16"], runs["notebook-fp16-scaler"]
    d = diff_sessions(before, after, labels=("fp16", "fp16-scaler"))
    for side in ("before", "after"):
        f = finding(surfaces[f"notebook-{'fp16' if side == 'before' else 'fp16-scaler'}"]["doc"],
                    "fp16-grad-underflow")  # fmt: skip
        got = getattr(d.metric("underflow_fraction"), side)
        if f is not None:
            assert got == pytest.approx(f["evidence"]["underflow_fraction"])
    want = units.percent(d.metric("underflow_fraction").before)
    page, text = text_of(diff_html(d, tmp_path)), diff_text(d)
    assert f"Gradient underflow (FP16 runs) {want}" in page and want in text
    assert f"Gradient underflow (FP16 runs) {want}" in text_of(html_lib.unescape(diff_inline(d)))
    assert units.micros(true_step_s(surfaces["notebook-fp16"]["doc"]) * 1e6) in page
    skips = true_skips(surfaces["notebook-fp16-scaler"]["doc"])
    assert skips is not None and d.metric("skipped_steps").after == skips[0]


def test_skipped_steps_and_loss_scale_are_one_number(surfaces: dict) -> None:
    seen = 0
    for name, s in pairs(surfaces):
        skips = true_skips(s["doc"])
        if skips is None:
            continue
        seen += 1
        skipped, steps = skips
        html = s["html"]
        assert f"skipped {skipped} of {steps} steps" in html, name  # numerics table
        assert f"{steps} steps seen, {skipped} skipped" in html, name  # GradScaler section
        f = finding(s["doc"], "skipped-steps")
        if skipped:
            assert f is not None and f"skipped {skipped} of {steps} steps" in f["title"], name
        tb = s["tb_text"]["summary/figures"]
        assert f"| Steps skipped by the GradScaler | {skipped} of {steps} |" in tb, name
        # the per-step curve sums to the same count where every step was recorded
        history = s["doc"]["scaler"]["history"]
        if len(history) == steps:
            assert sum(e.value for e in s["tb"].Scalars("scaler/skipped")) == skipped, name
            scales = [h["scale"] for h in history]
            assert [e.value for e in s["tb"].Scalars("scaler/loss_scale")] == scales, name
            first, last = units.scalar(scales[0]), units.scalar(scales[-1])
            assert f"scale from {first} to {last}" in html, name
    assert seen >= 2


def test_the_first_nonfinite_step_is_one_number(surfaces: dict) -> None:
    seen = 0
    for name, s in pairs(surfaces):
        f = finding(s["doc"], "nonfinite-origin")
        if f is None:
            continue
        seen += 1
        step, module = f["evidence"]["step"], f["evidence"]["module"]
        html = s["html"]
        # the numerics table and the loss chart state the finding's step, and no other
        assert f"first inf/NaN step {step}, " in html and f" of {module} " in html, name
        assert set(re.findall(r"first inf/NaN step (\d+)", html)) == {str(step)}, name
        assert set(re.findall(r"first inf/NaN \(step (\d+)\)", html)) <= {str(step)}, name
        assert set(re.findall(r"first appears at step (\d+)", html)) == {str(step)}, name
        # TensorBoard's text of the finding (or of the recommendation that merged it)
        said = [t for k, t in s["tb_text"].items() if k.startswith("findings/")]
        assert any(f"first appears at step {step} " in t for t in said), name
    assert seen >= 2  # the backward NaN (its table said step 5, the finding step 2) and FP16's


def test_speed_against_fp32_is_one_number(surfaces: dict) -> None:
    seen = 0
    sources = set()
    for name, s in pairs(surfaces):
        truth = true_speed(s["doc"])
        if truth is None:
            continue
        seen += 1
        ratio, source = truth
        sources.add(source)
        fig = s["doc"]["derived"]["figures"]["speed_vs_fp32"]
        assert fig["source"] == source and fig["time_ratio"] == pytest.approx(ratio), name
        shown = f"{ratio:.2f}"
        verdict = fig["verdict"]
        html, console = s["html"], s["console"]
        assert f"autocast / FP32 time {shown}×" in html, name
        assert f"{source}: " in console and f"({shown}x the time" in console, name
        assert f"Time against FP32 ({source}) | {shown}x" in s["tb_text"]["summary/figures"]
        # "Which precision": the run's own row states the same measurement, as a speed-up
        probe = s["doc"]["speed_probe"]
        run = {"float16": "fp16", "bfloat16": "bf16"}[probe["autocast"].split(":")[-1]]
        rows = {r["precision"]: r for r in (probe.get("precisions") or {}).get("results") or []}
        row = rows.get(run) or {}
        if source == "precision A/B":
            words = {"faster": "faster", "slower": "slower", "tied": "within the noise"}
            assert isinstance(row.get("speedup"), (int, float)), name
            assert f"{row['speedup']:.2f}x ({words[verdict]}" in html, name
            assert abs(1 / row["speedup"] - ratio) < 0.006 * max(1.0, ratio), name
        # autocast-slower, where it fired, states this ratio (not the probe's other one)
        slower = finding(s["doc"], "autocast-slower")
        if slower is not None:
            assert f"({shown}x" in slower["title"] or f"is {shown}x" in slower["title"], name
        # no statement says the opposite of the verdict
        if verdict == "tied":
            assert not re.search(rf"{re.escape(shown)}× \([\d.–×]+\): (faster|slower)", html)
    assert seen >= 3
    # the precision A/B's least version runs on every run (whether it runs no longer depends
    # on a noisy block's wall time), so every run here states the A/B's figure; the probe-only
    # path (a session without an A/B) is held in tests/analysis/test_precision_advice.py
    assert sources == {"precision A/B"}, sources


def _timed(walls: list[float], time_share: float) -> Session:
    steps = [{"index": i, "wall_s": w} for i, w in enumerate(walls)]
    return Session(steps=steps, sections={"precision": {"audited": True, "ops": [
        {"op": "mm", "dtype": "bfloat16", "low_precision": True, "time_us": 100 * time_share},
    ]}})  # fmt: skip


def test_the_diff_judges_each_figure_by_its_direction(tmp_path: Path) -> None:
    # a BF16 run 7x faster per step: better step time and better steps per second, whatever
    # the share of its op time in low precision did (a description, not a goal)
    slow = [9.0, 0.70, 0.72, 0.69, 0.71, 0.70]
    fast = [9.0] + [w / 7 for w in slow[1:]]
    d = diff_sessions(Session(steps=[{"index": i, "wall_s": w} for i, w in enumerate(slow)]),
                      Session(steps=[{"index": i, "wall_s": w} for i, w in enumerate(fast)]),
                      labels=("fp16", "bf16"))  # fmt: skip
    step, rate = d.metric("step_time_s"), d.metric("throughput")
    assert step.before == pytest.approx(statistics.median(slow[1:]))
    assert step.after == pytest.approx(statistics.median(fast[1:]))
    assert rate.after == pytest.approx(1 / statistics.median(fast[1:]))
    assert (step.verdict, rate.verdict) == ("better", "better")
    assert d.metric("low_precision_time_share").better == "none"
    page = text_of(diff_html(d, tmp_path))
    assert re.search(r"Step time \(median\) [\d.]+ ms [\d.]+ ms -86% better", page), page
    assert re.search(r"Steps per second [\d.]+ steps/s [\d.]+ steps/s \+\d+% better", page), page
    # the page links both reports and charts both runs' step times
    assert "<svg" in diff_html(d, tmp_path)


def test_memory_peak_is_one_number(
    surfaces: dict, runs: dict[str, Session], tmp_path: Path
) -> None:
    seen = 0
    for name, s in pairs(surfaces):
        peak = ((s["doc"].get("memory") or {}).get("peak") or {}).get("bytes")
        if not isinstance(peak, int):
            continue
        seen += 1
        want = units.nbytes(peak)
        assert f"Peak: {want} " in s["html"], name  # the memory section
        assert f"| Memory peak | {want} |" in s["tb_text"]["summary/figures"], name
        d = diff_sessions(runs[name], runs[name], labels=(name, name))
        assert f"Memory peak {want} {want}" in text_of(diff_html(d, tmp_path)), name
    assert seen >= 3
