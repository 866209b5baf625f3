"""straggler-rank on synthetic GPU traces whose straggler is known (tests/distributed/synthetic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampdiag.analysis import analyze
from ampdiag.sources.traces import session_from_traces
from tests.distributed.synthetic import rank_traces


def _findings(folder: Path) -> dict[str, object]:
    session = session_from_traces(folder)
    session.findings = analyze(session)
    return {f.id: f for f in session.findings}


@pytest.mark.parametrize("straggler", [0, 1])
@pytest.mark.parametrize("kind", ["host", "compute"])
def test_the_straggler_is_the_late_rank(tmp_path: Path, straggler: int, kind: str) -> None:
    delay = 4000.0
    rank_traces(tmp_path, straggler, kind=kind, delay_us=delay)
    found = _findings(tmp_path)
    f = found["straggler-rank"]
    ev = f.evidence  # type: ignore[attr-defined]
    assert ev["rank"] == straggler
    assert ev["last_share"] == 1.0
    # the others waited for it about the delay built in (launch offsets: within 5%)
    assert ev["lateness_us_median"] == pytest.approx(delay, rel=0.05)
    if kind == "host":
        assert ev["extra_us_per_step"]["other"] == pytest.approx(delay, rel=0.05)
        assert "outside any op" in ev["where"][0]
    else:
        assert ev["gpu_compute_extra_us_per_step"] == pytest.approx(delay, rel=0.05)
        assert ev["where"][0].startswith("GPU computation")
    # the waiting rank's idle GPU and exposed all-reduce are not advice of their own
    for other in ("comm-not-overlapped", "gpu-idle", "increase-batch-size"):
        if other in found:
            assert found[other].evidence.get("rank", straggler) == straggler  # type: ignore[attr-defined]


def test_balanced_ranks_have_no_straggler(tmp_path: Path) -> None:
    rank_traces(tmp_path, None)
    session = session_from_traces(tmp_path)
    comm = session.sections["timeline"]["communication"]
    assert comm["matched"] == 5  # one all-reduce per step, matched on both ranks
    assert "straggler-rank" not in _findings(tmp_path)


def test_communication_per_step_from_nccl_kernels(tmp_path: Path) -> None:
    rank_traces(tmp_path, 1, delay_us=4000.0, transfer_us=300.0)
    ranks = session_from_traces(tmp_path).sections["timeline"]["ranks"]
    by_rank = {r["rank"]: r["collectives"] for r in ranks}
    assert by_rank[0]["source"] == "gpu"
    for c in by_rank.values():
        assert [s["count"] for s in c["steps"]] == [1] * 5
    # rank 0 waits the delay plus the transfer in each all-reduce, rank 1 only transfers
    assert by_rank[0]["per_step"]["time_us"] == pytest.approx(4300.0, rel=0.05)
    assert by_rank[1]["per_step"]["time_us"] == pytest.approx(300.0, rel=0.2)
    # nothing computes during the all-reduce: all of it is exposed
    assert by_rank[0]["per_step"]["exposed_us"] == pytest.approx(by_rank[0]["per_step"]["time_us"])
