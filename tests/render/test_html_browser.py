"""The HTML report opened in real headless Chromium (Debian's chromium, driven by playwright).

No console errors, the overview and every section present, no request leaves the page, hostile
module names and exception messages shown as text with no script run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ampdiag.render.sections import registry
from ampdiag.session import Session
from tests.render.conftest import EVIL_MESSAGE, EVIL_MODULE

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None, reason="needs Debian's chromium at /usr/bin/chromium"
    ),
    pytest.mark.slow,  # starts a browser
]

#: The topic sections (every report has them), from the section registry.
TOPICS = [(s.id, s.title, s.needs) for s in registry() if s.needs is not None]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


class Opened:
    """A page with everything it did recorded."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.context = browser.new_context(java_script_enabled=True)
        self.page = page = self.context.new_page()
        page.on("console", lambda m: self.console.append((m.type, m.text)))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

        def route(r: Any) -> None:
            self.requests.append(r.request.url)
            if r.request.url.startswith(("file://", "data:")):
                r.continue_()
            else:
                r.abort()

        page.route("**/*", route)
        page.goto(path.resolve().as_uri())
        page.wait_for_load_state("load")
        page.wait_for_timeout(300)  # let any (forbidden) onerror handler have its chance

    def outside(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file://", "data:"))]

    def close(self) -> None:
        self.context.close()


def open_report(browser: Any, path: Path) -> Opened:
    assert path.is_file()
    return Opened(browser, path)


def test_report_opens_cleanly_with_every_section(browser: Any, evil_run: Session) -> None:
    assert evil_run.path is not None
    page = open_report(browser, evil_run.path / "report.html")
    try:
        assert [c for c in page.console if c[0] == "error"] == []
        assert page.errors == []
        assert page.outside() == []
        assert page.dialogs == []
        p = page.page
        for sid in ("overview", *(t[0] for t in TOPICS), "environment"):
            assert p.locator(f"section#{sid} h2").is_visible(), sid
            assert p.locator(f'nav a[href="#{sid}"]').count() == 1
        # The overview comes first and holds the verdict.
        assert p.locator("main > section").first.get_attribute("id") == "overview"
        assert p.locator("section#overview .verdict").inner_text().strip()
        # Figures are drawn SVG, laid out at a readable width.
        widths = p.eval_on_selector_all(
            "figure.figure svg", "els => els.map(e => e.getBoundingClientRect().width)"
        )
        assert widths and all(w > 100 for w in widths)
        # Anchor navigation works without scripts.
        p.click('nav a[href="#gradscaler"]')
        assert p.evaluate("location.hash") == "#gradscaler"
    finally:
        page.close()


def test_hostile_module_name_is_text_and_runs_nothing(browser: Any, evil_run: Session) -> None:
    assert evil_run.path is not None
    page = open_report(browser, evil_run.path / "report.html")
    try:
        p = page.page
        # The probe's per-module table and the finding show the name as text.
        assert p.get_by_text(EVIL_MODULE, exact=True).count() >= 2
        assert p.locator('img[src="x"]').count() == 0
        assert p.locator("script").count() == 1  # ours alone
        assert page.dialogs == [] and page.errors == []
        assert page.outside() == []
    finally:
        page.close()


def test_hostile_exception_message_is_text(browser: Any, error_run: Session) -> None:
    assert error_run.path is not None
    page = open_report(browser, error_run.path / "report.html")
    try:
        p = page.page
        assert p.get_by_text(EVIL_MESSAGE, exact=True).count() >= 1
        assert p.locator('img[src="y"]').count() == 0 and p.locator("script").count() == 1
        assert page.dialogs == [] and page.errors == [] and page.outside() == []
    finally:
        page.close()


def test_the_csp_blocks_script_and_network_even_if_escaping_failed(
    browser: Any, tmp_path: Path
) -> None:
    """Defence in depth: raw markup injected past the escaping still cannot run or fetch."""
    from markupsafe import Markup

    from ampdiag.render.html import render_html
    from ampdiag.render.sections import ReportSection

    injected = Markup(
        '<script>alert("script")</script><img src="x" onerror="alert(1)">'
        '<img src="http://198.51.100.1/pixel.png"><link rel="stylesheet" '
        'href="https://198.51.100.1/x.css">'
    )
    html = render_html(Session(), [ReportSection("evil", "Evil", injected)])
    target = tmp_path / "report.html"
    target.write_text(html, encoding="utf-8")
    page = open_report(browser, target)
    try:
        assert page.dialogs == []
        assert page.outside() == []  # blocked by the CSP before any request is made
        refused = [t for kind, t in page.console if "Content Security Policy" in t]
        assert refused, page.console
    finally:
        page.close()


def test_tables_sort_charts_answer_hover_and_zoom(browser: Any, tmp_path: Path) -> None:
    """What the reader does with the report: sort a table by a column, hover a point of a
    step chart for its value, zoom into the steps; all offline, and the script blocked by
    nothing (no CSP refusal, no error)."""
    from tests.render.test_step_charts import loop

    d, losses = loop(tmp_path / "r", 12)
    page = open_report(browser, d.out / "report.html")
    try:
        p = page.page
        assert page.errors == [] and page.outside() == [] and page.dialogs == []
        assert not [t for _, t in page.console if "Content Security Policy" in t], page.console
        assert p.evaluate("document.documentElement.dataset.interactive") == "yes"
        # Sort the profiled ops by their self CPU time: the page's order follows the numbers.
        table = p.locator("section#time table", has=p.locator("th", has_text="self CPU")).first
        header = table.locator("th", has_text="self CPU")
        column = table.locator("th").all_inner_texts().index(header.inner_text())
        header.click()
        cells = table.locator(f"tbody tr td:nth-child({column + 1})").all_inner_texts()
        scale = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}

        def seconds(text: str) -> float:
            number, unit = text.split()
            return float(number.replace(",", "")) * scale[unit]

        assert len(cells) >= 3 and [seconds(c) for c in cells] == sorted(
            (seconds(c) for c in cells), reverse=True
        )
        header.click()
        cells = table.locator(f"tbody tr td:nth-child({column + 1})").all_inner_texts()
        assert [seconds(c) for c in cells] == sorted(seconds(c) for c in cells)
        # Hover: each point of the loss chart says its step and the loss the loop computed.
        points = p.locator('figure[aria-label="loss"] g.points circle')
        assert points.count() == len(losses)
        tip = points.nth(3).locator("title").text_content() or ""
        assert tip.startswith("step 3: ") and abs(
            float(tip.split(": ")[1].split()[0]) - losses[3]
        ) < (1e-3 * abs(losses[3]) + 1e-9)
        # Zoom: the wheel narrows the step axis of the chart, a double click restores it.
        chart = p.locator('figure[aria-label="step-times"] svg')
        box = chart.bounding_box()
        assert box is not None
        p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        for _ in range(4):
            p.mouse.wheel(0, -120)
        lo, hi = (float(chart.get_attribute(a) or "nan") for a in ("data-zoom-lo", "data-zoom-hi"))
        whole = float(chart.get_attribute("data-hi") or 0) - float(
            chart.get_attribute("data-lo") or 0
        )
        assert 0 < hi - lo < 0.6 * whole
        chart.dblclick()
        lo, hi = (float(chart.get_attribute(a) or "nan") for a in ("data-zoom-lo", "data-zoom-hi"))
        assert hi - lo == pytest.approx(whole)
        # A section folds under its heading and opens again.
        p.locator("section#time > h2").click()
        assert not table.is_visible()
        p.locator("section#time > h2").click()
        assert table.is_visible()
        assert page.errors == [] and page.outside() == []
    finally:
        page.close()


@pytest.mark.parametrize("scenario", ["amp", "underflow"])
def test_the_demo_reports_are_short(browser: Any, tmp_path: Path, scenario: str) -> None:
    """The FP16 demos' reports fit 8,000 px at 1,400 px wide: sections fold long tables to
    their first rows, detail tables and repeated fixes sit one click away."""
    from ampdiag.demo import run_demo

    out = run_demo(tmp_path / scenario, scenario=scenario, device="cpu")
    page = open_report(browser, out / "report.html")
    try:
        p = page.page
        p.set_viewport_size({"width": 1400, "height": 1000})
        height = p.evaluate("document.documentElement.scrollHeight")
        assert height <= 8000, height
        assert page.errors == [] and page.outside() == []
        # nothing was dropped to get there: every section and finding is still in the page
        for sid in ("overview", "time", "precision", "numerics", "memory", "environment"):
            assert p.locator(f"section#{sid}").count() == 1
    finally:
        page.close()


def test_the_diff_page_links_both_reports_and_charts_both_runs(
    browser: Any, tmp_path: Path
) -> None:
    """The diff page in Chromium: no error, no request out, a link to each run's report that
    opens it, and a step-time chart whose points hover each run's own loss."""
    from ampdiag.cli import main
    from tests.render.test_step_charts import loop

    (a, losses_a), (b, losses_b) = loop(tmp_path / "before", 6), loop(tmp_path / "after", 6)
    for d in (a, b):
        from ampdiag.render.html import write_html

        write_html(d.session, d.out)
    out = tmp_path / "cmp"
    assert main(["diff", str(a.out), str(b.out), "--out", str(out)]) == 0
    page = open_report(browser, out / "diff.html")
    try:
        p = page.page
        assert page.errors == [] and page.outside() == [] and page.dialogs == []
        hrefs = p.locator("a").evaluate_all("els => els.map(e => e.href)")
        assert [Path(h.removeprefix("file://")).resolve() for h in hrefs] == [
            (a.out / "report.html").resolve(),
            (b.out / "report.html").resolve(),
        ]
        tips = p.locator('figure[aria-label="loss"] g.points circle title').all_text_contents()
        for name, losses in (("before", losses_a), ("after", losses_b)):
            mine = [t for t in tips if t.startswith(f"{name} — ")]
            assert len(mine) == len(losses)
            got = [float(t.split(": ")[1].split()[0]) for t in mine]
            assert got == pytest.approx(losses, rel=1e-3)
        p.locator("a").first.click()
        p.wait_for_load_state("load")
        assert p.url.endswith("/before/report.html") and page.outside() == []
    finally:
        page.close()
