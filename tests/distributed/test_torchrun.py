"""Real 2-rank jobs (torchrun over gloo on the CPU), held against what each scenario measured.

One torchrun job runs every scenario of ``worker.py`` (the process group's start dominates a
tiny job); each scenario wrote its own truth next to the ranks' sessions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("worker.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*cmd, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def truth(folder: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / f"truth-rank-{rank}.json").read_text())
    return data


def report(folder: Path) -> dict[str, Any]:
    """``ampdiag report FOLDER --format json``, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "ampdiag", "report", str(folder), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def findings(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in doc["findings"]}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_training_is_bit_identical_under_diagnose(runs: Path, dtype: str) -> None:
    for rank in (0, 1):
        watched = truth(runs / f"ddp-{dtype}", rank)["params_sha256"]
        assert watched == truth(runs / f"ddp-{dtype}-plain", rank)["params_sha256"]


@pytest.mark.parametrize("scenario", ["ddp-bf16", "ddp-fp16"])
def test_the_merged_report_reads_every_ranks_session(runs: Path, scenario: str) -> None:
    doc = report(runs / scenario)
    rows = doc["ranks"]["rows"]
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        own = json.loads((runs / scenario / f"rank-{r['rank']}" / "session.json").read_text())
        assert r["steps"] == len(own["steps"]) == 6  # the worker's STEPS
        assert r["step_times_ms"] == pytest.approx([s["wall_s"] * 1000 for s in own["steps"]])
        assert r["autocast"] == own["environment"]["autocast"]
        assert r["grad_nonfinite"] == own["gradients"]["totals"]["nonfinite"]
    assert doc["environment"]["world_size"] == 2
    # communication from the gloo spans: one bucket (the accumulation scenario's comm hook
    # counted one all-reduce per synchronised backward of this model)
    buckets = truth(runs / "accum-nosync", 0)["allreduces_per_step"][-1]
    for r in doc["timeline"]["ranks"]:
        c = r["collectives"]
        assert c["source"] == "host"
        assert [s["allreduces"] for s in c["steps"]] == [buckets] * len(c["steps"])
        assert 0 < c["per_step"]["exposed_us"] <= c["per_step"]["time_us"]


def test_collectives_are_never_fp32_work(runs: Path) -> None:
    from ampdiag.analysis.precision import is_communication_op, summarize
    from ampdiag.session import load

    for scenario in ("ddp-bf16", "ddp-fp16", "straggler", "accum", "fsdp2"):
        for rank in (0, 1):
            session = load(runs / scenario / f"rank-{rank}")
            ops = session.section("precision").get("ops", [])
            assert any(is_communication_op(o["op"]) for o in ops)  # the audit saw them ...
            summary = summarize(session.section("precision"))
            named = [o["op"] for o in summary["top_fp32_by_time"]]
            assert not [n for n in named if is_communication_op(n)]  # ... and does not count them
    doc = report(runs / "ddp-bf16")
    for f in doc["findings"]:
        assert "c10d" not in f["title"] and "allreduce" not in f["title"]


def test_straggler_is_the_sleeping_rank(runs: Path) -> None:
    slept = truth(runs / "straggler", 1)["slept_s"]
    assert len(slept) == 6 and not truth(runs / "straggler", 0)["slept_s"]
    f = findings(report(runs / "straggler"))["straggler-rank"]
    ev = f["evidence"]
    assert ev["rank"] == 1
    sleep_us = 1e6 * sum(slept) / len(slept)
    # rank 0 waits about the sleep per step (its own work overlaps part of rank 1's)
    assert 0.6 * sleep_us <= ev["lateness_us_median"] <= 1.3 * sleep_us
    assert ev["extra_us_per_step"]["other"] == pytest.approx(sleep_us, rel=0.4)
    assert "outside any op" in ev["where"][0]
    assert "bucket" not in f["fix"].split("tuning DDP")[0]


def test_redundant_allreduce_without_no_sync(runs: Path) -> None:
    t = truth(runs / "accum", 0)
    f = findings(report(runs / "accum"))["redundant-allreduce"]
    ev = f["evidence"]
    profiled = ev["steps"]
    assert ev["allreduces_per_step"] == t["allreduces_per_step"][profiled[0]] == 4
    assert ev["micro_batches"] == t["micro_batches"]
    assert ev["buckets"] == truth(runs / "accum-nosync", 0)["allreduces_per_step"][0]
    assert "no_sync()" in f["fix"] and "accumulate(" in f["fix"]


def test_no_sync_accumulation_is_not_redundant(runs: Path) -> None:
    assert truth(runs / "accum-nosync", 0)["allreduces_per_step"] == [1] * 6
    doc = report(runs / "accum-nosync")
    assert "redundant-allreduce" not in findings(doc)
    steps = doc["timeline"]["ranks"][0]["collectives"]["steps"]
    assert [s["allreduces_per_micro_batch"] for s in steps] == [[0, 0, 0, 1]] * len(steps)


def test_a_report_reads_the_folder_as_it_is_now(runs: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(runs / "ddp-bf16", folder)
    cli = [sys.executable, "-m", "ampdiag", "report", str(folder)]
    assert subprocess.run(cli, capture_output=True, timeout=300).returncode == 0
    assert (folder / "session.json").is_file()  # the report's own output ...
    shutil.rmtree(folder / "rank-1")
    assert [r["rank"] for r in report(folder)["ranks"]["rows"]] == [0]  # ... is not input


def test_fsdp2_on_the_local_shard(runs: Path) -> None:
    from ampdiag.session import load

    for rank in (0, 1):
        t = truth(runs / "fsdp2", rank)
        session = load(runs / "fsdp2" / f"rank-{rank}")
        assert not session.section("run")["warnings"]  # the gradient collector read DTensors
        grads = session.section("gradients")["totals"]
        assert grads["n"] > 0
        # memory per rank is the local shard (half the model on 2 ranks), counted once
        state = session.section("memory")["model_state"]
        assert state["parameters"] == t["local_param_bytes"] == t["full_param_bytes"] // 2
    found = findings(report(runs / "fsdp2"))
    assert "low-precision-inactive" not in found  # the policy's bf16 matmuls are low precision
    mp = found["fsdp-mixed-precision"]
    assert mp["evidence"]["param_dtype"] == "bfloat16"
    assert mp["evidence"]["reduce_dtype"] == "float32" and "FP32" in mp["title"]


def test_fsdp2_nan_is_named_on_the_rank_that_made_it(runs: Path) -> None:
    """Rank 1 made the NaN in module 0's forward (its own hook measured it); rank 0 only
    received it. The merged report names rank 1, its step, phase and module; its cause never
    contradicts the BF16 policy nor claims an FP32 replay that did not run."""
    made = {r: truth(runs / "fsdp2-nan", r)["made_nan_at_steps"] for r in (0, 1)}
    assert made[1] and not made[0], made
    doc = report(runs / "fsdp2-nan")
    found = findings(doc)
    verdict = found["diverged"]  # nonfinite-origin is merged under it (cause not measured)
    ev = verdict["evidence"]
    assert ev["origin_rank"] == 1 and ev["received_ranks"] == [0], verdict
    assert ev["step"] == made[1][0] and "activation" in ev["held"], verdict  # the forward
    assert ev["module"] == "0" and ev["run_precision"] == "bf16", verdict
    assert ev["cause"] == "unknown", verdict  # no replay ran: not "not the precision"
    for f in doc["findings"]:
        text = f"{f['title']} {f.get('fix') or ''}"
        assert "computes in FP32" not in text, text
        assert "FP32 too" not in text, text


def test_wrapped_optimizer_steps_count_once(runs: Path) -> None:
    from ampdiag.session import load

    for rank in (0, 1):
        t = truth(runs / "zero", rank)
        run = load(runs / "zero" / f"rank-{rank}").section("run")
        assert run["optimizer_steps"] == t["steps"], run["optimizer_steps"]
    for f in report(runs / "zero")["findings"]:
        assert "ZeRO" not in (f.get("fix") or ""), f


def _merged_the_old_way(folder: Path) -> list[dict[str, Any]]:
    """The findings of the merge before summaries: each whole session analysed, traces read."""
    from ampdiag.analysis import analyze
    from ampdiag.analysis.advisors import advise
    from ampdiag.analysis.ranks import merge_findings
    from ampdiag.analysis.registry import run_rules
    from ampdiag.session import Session, load
    from ampdiag.sources.ranks import rank_folders
    from ampdiag.trace.reader import read_trace

    per_rank, files = [], []
    for rank, sub in rank_folders(folder):
        member = load(sub)
        member.findings = []
        files += [sub / f for f in member.section("profiler")["trace_files"]]
        per_rank.append((rank, analyze(member)))
    from ampdiag.analysis.communication import across_ranks, rank_communication
    from ampdiag.analysis.timeline import analyze_rank

    ranks = []
    for i, f in enumerate(files):  # one after the other, in this process
        rt = read_trace(f, i)
        ranks.append({**analyze_rank(rt), "collectives": rank_communication(rt)})
    together = Session(
        sections={"timeline": {"ranks": ranks, "communication": across_ranks(ranks)}}
    )
    return [f.to_dict() for f in merge_findings(per_rank, advise(together, run_rules(together)))]


def test_many_copied_ranks_merge_to_the_same_findings_in_small_summaries(
    runs: Path, tmp_path: Path
) -> None:
    from tests.distributed.copies import copy_ranks

    n = 40  # more than a process pool's threshold: the merge runs over a pool
    sources = copy_ranks(runs / "straggler", tmp_path, n)
    sleepers = {r for r, s in enumerate(sources) if truth(runs / "straggler", s)["slept_s"]}
    assert sleepers == set(range(1, n, 2))
    doc = report(tmp_path)
    assert doc["findings"] == _merged_the_old_way(tmp_path)
    found = findings(doc)
    assert found["straggler-rank"]["evidence"]["rank"] in sleepers
    assert [r["rank"] for r in doc["ranks"]["rows"]] == list(range(n))
    assert [r["rank"] for r in doc["timeline"]["ranks"]] == list(range(n))
    # what the merge keeps of a rank is a summary, far smaller than its session
    assert "members" not in doc["ranks"]
    per_rank = len(json.dumps(doc["ranks"])) / n
    assert per_rank < 0.1 * (tmp_path / "rank-0" / "session.json").stat().st_size
