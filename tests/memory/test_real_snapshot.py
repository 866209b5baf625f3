"""A real CUDA memory snapshot: its top sites at the peak name the user's Python line.

The snapshot is ``snapshot.pickle`` of the public repository github.com/JasperSolt/EoR_NN (a
training/analysis job on one GPU, recorded with torch's ``_record_memory_history(stacks="all")``:
C++ and Python frames), committed gzipped as tests/data/cuda/snapshot_eor_nn.pickle.gz. The
truth is a replay of its allocator history written here, with its own reading of the frames:
the first frame whose file is a ``.py`` outside torch and site-packages is the user's line.
"""

from __future__ import annotations

import gzip
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from ampdiag.analysis import analyze
from ampdiag.render.console import summary
from ampdiag.render.html import render_html
from ampdiag.sources.snapshot import session_from_snapshot

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "cuda" / "snapshot_eor_nn.pickle.gz"


@pytest.fixture(scope="module")
def snap_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snap") / "snapshot.pickle"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def _user_line(frames: list[dict[str, Any]]) -> str | None:
    for f in frames:
        name = str(f["filename"])
        if name.endswith(".py") and "/torch/" not in name and "-packages/" not in name:
            return f"{'/'.join(name.split('/')[-2:])}:{f['line']} {f['name']}"
    return None


def _live_at_peak(snap: dict[str, Any]) -> tuple[int, dict[int, tuple[int, Any]]]:
    """Replays the history: the peak of allocated bytes and what was live at it.

    It starts from what was live when the recording began: the blocks allocated at the end
    that the history never allocated, and the blocks the history frees before allocating.
    """
    trace = snap["device_traces"][0]
    in_history = {e["addr"] for e in trace if e["action"] == "alloc"}
    live: dict[int, tuple[int, Any]] = {
        b["address"]: (b["size"], b.get("frames", []))
        for seg in snap["segments"]
        for b in seg["blocks"]
        if b["state"] == "active_allocated" and b["address"] not in in_history
    }
    seen: set[int] = set()
    for e in trace:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_completed" and e["addr"] not in seen:
            live[e["addr"]] = (e["size"], e["frames"])  # allocated before the recording
    # the bytes at the start: the end's allocated bytes less what the history added (2,032 B
    # more than the blocks above: one the snapshot does not show)
    end = sum(
        b["size"] for seg in snap["segments"] for b in seg["blocks"]
        if b["state"] == "active_allocated"
    )  # fmt: skip
    net = sum(e["size"] * {"alloc": 1, "free_completed": -1}.get(e["action"], 0) for e in trace)
    now = best = end - net
    best_live = dict(live)
    for e in trace:
        if e["action"] == "alloc":
            now += e["size"]
            live[e["addr"]] = (e["size"], e["frames"])
            if now > best:
                best, best_live = now, dict(live)
        elif e["action"] == "free_completed":
            now -= e["size"]
            live.pop(e["addr"], None)
    return best, best_live


def test_top_sites_name_the_python_line_wherever_one_was_recorded(snap_path: Path) -> None:
    with open(snap_path, "rb") as fh:
        snap = pickle.load(fh)  # a fixture of ours (the product loads it without pickle)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    with_python = [e for e in allocs if _user_line(e["frames"])]
    assert (len(allocs), len(with_python)) == (1935, 604)
    peak, live = _live_at_peak(snap)
    assert peak == 108_270_580
    truth: dict[str, int] = {}
    no_line = 0
    for size, frames in live.values():
        line = _user_line(frames)
        if line is None:
            no_line += 1
        else:
            truth[line] = truth.get(line, 0) + size

    session = session_from_snapshot(snap_path)
    cuda = session.section("memory")["cuda"]
    assert cuda["peak"]["allocated_bytes"] == peak
    sites = cuda["peak"]["top_sites"]
    by_site: dict[str, int] = {}
    for s in sites:
        text = " ".join([s["site"], *s["frames"]])
        assert "gather_with_cpp" not in text and "CachingAllocator" not in text
        assert ".cpp" not in text
        by_site[s["site"]] = by_site.get(s["site"], 0) + s["bytes"]
    # every site named as a Python line is one the allocations recorded, with at most its bytes
    named = {k: v for k, v in by_site.items() if not k.startswith("<")}
    assert named and set(named) <= set(truth)
    assert all(v <= truth[k] for k, v in named.items())
    assert "FourierNN/counterfactuals.py:102 generate_counterfactuals" in named
    # the largest Python lines at the peak are all among the top sites
    biggest = sorted(truth, key=lambda k: -truth[k])[:3]
    assert set(biggest) <= set(named)
    # and a site without a Python line holds only allocations that recorded none
    unnamed = sum(s["count"] for s in sites if s["site"].startswith("<"))
    assert unnamed <= no_line
    assert all(s["op"] is None or s["op"].startswith("aten::") for s in sites)


def test_snapshot_report_is_memory_only_and_says_what_it_cannot_know(snap_path: Path) -> None:
    session = session_from_snapshot(snap_path)
    session.findings = analyze(session)
    html = render_html(session)
    titles = re.findall(r"<h2[^>]*>(.*?)<", html)
    assert "Memory" in titles
    for live_only in ("Step time", "Precision", "Numerics", "GradScaler"):
        assert live_only not in titles
    assert "No data for this section" not in html
    text = re.sub(r"<[^>]+>", " ", html)
    assert re.search(
        r"Model state: parameters \+ gradients \+ optimizer state\s+not measured", text
    )
    assert "0 B" not in text
    assert "counterfactuals.py:102 generate_counterfactuals" in text
    assert "memory_probe" not in text  # live-run advice has no place here
    assert 'aria-label="cuda-allocator"' in html  # allocated vs reserved over the history
    line = summary(session)
    assert "cuda (?)" not in line
    assert "CUDA allocator peak: 103.3 MiB allocated, 128.0 MiB reserved" in line
