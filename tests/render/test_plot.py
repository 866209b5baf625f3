"""matplotlib figures on demand: ``ampdiag.plot`` and ``ampdiag report --format png|pdf``.

The session is the demo's (``ampdiag demo``: FP16 without a GradScaler, 100 steps on a CPU,
saved as tests/data/sessions/demo-underflow.json), which measured all four figures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "tests" / "data" / "sessions" / "demo-underflow.json"


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    folder.mkdir()
    shutil.copy(SESSION, folder / "session.json")
    return folder


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampdiag", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.parametrize("fmt", ["png", "pdf"])
def test_report_format_writes_each_figure(run_dir: Path, fmt: str) -> None:
    r = _cli("report", str(run_dir), "--format", fmt)
    assert r.returncode == 0, r.stderr[-2000:]
    written = sorted(p.name for p in (run_dir / "figures").iterdir())
    assert written == sorted(f"{n}.{fmt}" for n in ("steps", "underflow", "precision", "memory"))
    for path in (run_dir / "figures").iterdir():
        if fmt == "pdf":
            assert path.read_bytes()[:5] == b"%PDF-"
            continue
        with Image.open(path) as im:
            im.load()  # a whole, decodable image
            # 8 inches wide at 100 dpi; 3.2 inches per chart (steps: loss and wall time)
            charts = 2 if path.stem == "steps" else 1
            assert im.size == (800, 320 * charts), path.name
            colors = im.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colors is not None and len(colors) > 10  # something is drawn


def test_figures_show_the_session_s_own_numbers(run_dir: Path) -> None:
    import ampdiag

    raw = json.loads(SESSION.read_text())
    figs = ampdiag.plot(ampdiag.load(run_dir))
    assert set(figs) == {"steps", "underflow", "precision", "memory"}
    lost = raw["derived"]["numerics"]["underflow"]["module_lost_fraction"]
    (ax,) = figs["underflow"].axes
    widths = {
        t.get_text(): p.get_width() for t, p in zip(ax.get_yticklabels(), ax.patches, strict=True)
    }
    assert widths == pytest.approx({k: 100 * v for k, v in lost.items()})
    loss_ax = figs["steps"].axes[0]
    (line,) = loss_ax.get_lines()
    losses = [s["loss"] for s in raw["steps"]]
    assert list(line.get_ydata()) == pytest.approx(losses)
    timed = {r["time_ms"] for r in raw["speed_probe"]["precisions"]["results"] if r.get("time_ms")}
    (pax,) = figs["precision"].axes
    assert sorted(p.get_width() for p in pax.patches) == pytest.approx(sorted(timed))


def test_plot_leaves_the_backend_and_rcparams_as_they_were(run_dir: Path) -> None:
    code = f"""
import sys, matplotlib
matplotlib.use("svg")
matplotlib.rcParams["lines.linewidth"] = 7.5
before = (matplotlib.get_backend(), dict(matplotlib.rcParams))
import ampdiag
figs = ampdiag.plot({str(run_dir)!r})
figs["steps"].savefig(sys.argv[1] if len(sys.argv) > 1 else "/dev/null", format="png")
after = (matplotlib.get_backend(), dict(matplotlib.rcParams))
print(before == after, "matplotlib.pyplot" in sys.modules,
      figs["steps"].axes[0].get_lines()[0].get_linewidth())
"""
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # unchanged, no pyplot state, and the user's style applied (their line width)
    assert r.stdout.split() == ["True", "False", "7.5"]
