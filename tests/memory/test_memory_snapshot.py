"""CUDA snapshot summary, tested on a snapshot built to torch's documented format.

No GPU recording of the demo exists yet: tests/data/cuda/snapshot_documented_format.json is
hand-built to the format documented in torch/cuda/memory.py (_snapshot).
"""

import json
import pickle
from pathlib import Path

import pytest

from ampdiag.errors import InputError
from ampdiag.sources.snapshot import check_snapshot, session_from_snapshot, summarize_snapshot

MiB = 1024**2
FIXTURE = Path(__file__).parent.parent / "data" / "cuda" / "snapshot_documented_format.json"
A = 0x7F0000000000


def snapshot() -> dict:
    return json.loads(FIXTURE.read_text())


def test_peak_reserved_fragmentation_and_sites() -> None:
    s = summarize_snapshot(snapshot(), known={A: "parameters"})
    assert s["allocated_bytes"] == 512 * MiB  # live at the end: the parameter block
    assert s["reserved_bytes"] == 2048 * MiB
    assert s["trace_starts_empty"]
    peak = s["peak"]
    assert peak["allocated_bytes"] == (512 + 256 + 256 + 128) * MiB
    assert peak["reserved_bytes"] == 2048 * MiB
    assert peak["fragmentation_bytes"] == (2048 - 1152) * MiB
    assert peak["by_category"] == {"other": 640 * MiB, "parameters": 512 * MiB}
    sites = {s["frames"][0]: (s["bytes"], s["count"]) for s in peak["top_sites"]}
    # torch internals are dropped from a site: the user's frame is what is shown
    assert sites == {
        "user/train.py:12 <module>": (512 * MiB, 1),
        "user/train.py:30 forward": (512 * MiB, 2),
        "user/train.py:40 step": (128 * MiB, 1),
    }
    assert max(s["timeline"]["allocated"]) == peak["allocated_bytes"]


def test_oom_reports_what_was_held() -> None:
    s = summarize_snapshot(snapshot(), known={A: "parameters"})
    (oom,) = s["ooms"]
    assert oom["requested_bytes"] == 2048 * MiB
    assert oom["device_free_bytes"] == 100 * MiB
    assert oom["allocated_bytes"] == 512 * MiB
    assert oom["by_category"] == {"parameters": 512 * MiB}


def test_not_a_snapshot_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="not a PyTorch CUDA memory snapshot"):
        check_snapshot({"foo": 1})


def test_session_from_snapshot_pickle(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    session = session_from_snapshot(path)
    cuda = session.section("memory")["cuda"]
    assert cuda["peak"]["fragmentation_bytes"] == 896 * MiB
