"""The tutorials in notebooks/ run top to bottom in a fresh kernel, as a user runs them.

Each notebook asserts what its fix must have changed, so an executed notebook is a test of the
diagnosis it teaches, not only of the code running.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_tutorials() -> None:
    assert len(NOTEBOOKS) >= 3


#: Tutorials that teach something ampdiag still gets wrong: an xfail, with the reason.
KNOWN_WRONG: dict[str, str] = {}


def _case(path: Path) -> object:
    reason = KNOWN_WRONG.get(path.stem)
    marks = [pytest.mark.xfail(strict=False, reason=reason)] if reason else []
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("path", [_case(p) for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    # A copy beside its data, so the run writes its reports/ into tmp_path, not the checkout.
    work = tmp_path / "notebooks"
    shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns("reports", "*.ipynb"))
    (tmp_path / "tests").symlink_to(path.parent.parent / "tests")  # the trace fixtures
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "commit notebooks without outputs"
    )
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    html = [
        o["data"]["text/html"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]
    if path.stem != "02_memory_and_accumulation":
        # the report shows inline: a sandboxed iframe holding the whole, self-contained report
        assert html and html[0].startswith("<iframe srcdoc=") and " sandbox " in html[0]
