"""The compiled-template cache: a report rendered from it is the one compiled afresh, and a cache
that is corrupt or cannot be written never fails the render.

Truth: the HTML a process renders with no cache at all (jinja compiling every template), against
the HTML of later processes that load the compiled templates, of one whose cache files were
overwritten with garbage, and of one whose temporary folder cannot be written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jinja2.bccache import bc_magic

from tests.conftest import REPO

SESSION = REPO / "tests" / "data" / "sessions" / "main-f6ce857.json"

RENDER = """
import sys
from pathlib import Path
from ampdiag.analysis import analyze
from ampdiag.render import templating
from ampdiag.render.html import render_html
from ampdiag.session import Session
if sys.argv[2] == "nocache":
    templating._bytecode_cache = lambda: None
s = Session.from_dict(__import__("json").loads(Path(sys.argv[1]).read_text()))
s.findings = analyze(s)
sys.stdout.write(render_html(s))
"""


def _render(tmp: Path, mode: str = "cache") -> str:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", RENDER, str(SESSION), mode],
        capture_output=True, text=True, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _cache_files(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("_jinja2-cache-*/__ampdiag_*.cache"))


def test_a_report_from_the_cache_is_the_report_compiled_afresh(tmp_path: Path) -> None:
    fresh = _render(tmp_path, "nocache")
    assert _cache_files(tmp_path) == []  # no cache: nothing written
    first = _render(tmp_path)  # compiles, and writes the cache
    files = _cache_files(tmp_path)
    assert len(files) >= 5  # the page, the report and its sections
    second = _render(tmp_path)  # loads the compiled templates
    assert first == fresh and second == fresh
    for f in files:  # corrupt past jinja's header check: compiled again, the report unchanged
        f.write_bytes(bc_magic + b"not a pickled checksum")
    assert _render(tmp_path) == fresh


def test_a_temporary_folder_that_cannot_be_written_costs_only_the_compile(
    tmp_path: Path,
) -> None:
    fresh = _render(tmp_path, "nocache")
    # where jinja's private cache folder would be, a file: jinja refuses the folder as unsafe
    (tmp_path / f"_jinja2-cache-{os.getuid()}").write_text("a file, not a folder")
    assert _render(tmp_path) == fresh
    assert _cache_files(tmp_path) == []
