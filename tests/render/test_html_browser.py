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
        # Figures are real decoded images (data: URIs the CSP allows).
        widths = p.eval_on_selector_all("img.figure", "els => els.map(e => e.naturalWidth)")
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
        assert p.locator("script").count() == 0
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
        assert p.locator('img[src="y"]').count() == 0 and p.locator("script").count() == 0
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
