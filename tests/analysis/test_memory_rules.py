"""Memory rules on sessions built from measured-looking sections (thresholds at their edges)."""

import json
from pathlib import Path

from ampdiag.analysis import analyze
from ampdiag.analysis.rules.memory import THRESHOLDS
from ampdiag.session import Session
from ampdiag.sources.snapshot import summarize_snapshot

MiB = 1024**2
FIXTURE = Path(__file__).parent.parent / "data" / "cuda" / "snapshot_documented_format.json"


def ids(section: dict, **kw: object) -> dict:
    session = Session(sections={"memory": section, **kw.pop("sections", {})}, **kw)  # type: ignore[arg-type]
    session.findings = analyze(session)
    return {f.id: f for f in session.all_findings()}


def base(peak: int, cap: int, **extra: object) -> dict:
    return {
        "model_state": {
            "parameters": 100 * MiB,
            "gradients": 100 * MiB,
            "optimizer_state": 200 * MiB,
        },
        "peak": {"bytes": peak, "by_category": {"activations": peak - 400 * MiB}},
        "capacity_bytes": cap,
        "capacity_source": "CUDA device total memory",
        "observed_batch": 32,
        **extra,
    }


def test_near_capacity_thresholds() -> None:
    cap = 1000 * MiB
    assert "memory-near-capacity" not in ids(base(int(0.84 * cap), cap))
    f = ids(base(int(0.86 * cap), cap))["memory-near-capacity"]
    assert f.severity == "medium"
    assert f.evidence["peak_bytes"] == int(0.86 * cap)
    assert f.evidence["capacity_bytes"] == cap
    assert f.evidence["model_state_bytes"] == 400 * MiB
    assert f.evidence["activation_bytes"] == int(0.86 * cap) - 400 * MiB
    assert ids(base(int(0.96 * cap), cap))["memory-near-capacity"].severity == "high"


def test_grad_accumulation_plan_from_measured_per_sample() -> None:
    probe = {"points": [[2, 10 * MiB + 2 * 20 * MiB], [4, 10 * MiB + 4 * 20 * MiB]]}
    sec = base(1000 * MiB, 2000 * MiB, probes=[probe], target_batch=128)
    f = ids(sec)["use-grad-accumulation"]
    # usable 1800 MiB; base = 1000 - 32*20 = 360 MiB; largest = (1800-360)/20 = 72
    assert f.evidence["accumulation_steps"] == 2
    assert f.evidence["micro_batch"] == 64
    assert f.evidence["per_sample_activation_bytes"] == 20 * MiB
    # a target that fits: no finding
    assert "use-grad-accumulation" not in ids(
        base(1000 * MiB, 2000 * MiB, probes=[probe], target_batch=40)
    )


def test_amp_memory_not_reduced_when_model_state_dominates() -> None:
    run = {"run": {"autocast_seen": {"cuda:float16": 4}}}
    f = ids(base(700 * MiB, 10_000 * MiB), sections=run)["amp-memory-not-reduced"]
    assert f.evidence["model_state_share"] == round(400 / 700, 4)
    assert "optimizer" in f.fix
    assert "amp-memory-not-reduced" not in ids(base(2000 * MiB, 10_000 * MiB), sections=run)
    # no autocast: nothing to say
    assert "amp-memory-not-reduced" not in ids(base(700 * MiB, 10_000 * MiB))


def test_fragmentation_and_oom_from_the_snapshot() -> None:
    summary = summarize_snapshot(json.loads(FIXTURE.read_text()))
    stats = {"num_alloc_retries": 0, "num_ooms": 1, "capacity_bytes": 80 * 1024 * MiB}
    found = ids(
        {"cuda": {**summary, "stats": stats}},
        status="error",
        error={"type": "OutOfMemoryError", "message": "CUDA out of memory"},
    )
    frag = found["allocator-fragmentation"]
    assert frag.evidence["fragmentation_bytes"] == 896 * MiB
    assert frag.evidence["fragmentation_share"] >= THRESHOLDS.fragmentation_share
    oom = found["out-of-memory"]
    assert oom.severity == "high"
    assert oom.evidence["requested_bytes"] == 2048 * MiB
    assert oom.evidence["held_by_category"] == {"other": 512 * MiB}


def test_retries_alone_flag_fragmentation() -> None:
    cuda = {
        "peak": {"fragmentation_bytes": 0, "reserved_bytes": 100, "allocated_bytes": 100},
        "stats": {"num_alloc_retries": 3},
    }
    assert ids({"cuda": cuda})["allocator-fragmentation"].evidence["num_alloc_retries"] == 3
