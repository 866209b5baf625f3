"""The HTML report's structure, escaping and offline-ness (string level; the browser test opens
it for real)."""

from __future__ import annotations

import base64
import hashlib
import html as html_lib
import re

from ampdiag.analysis.advisors import advise
from ampdiag.render.html import render_html
from ampdiag.render.sections import registry
from ampdiag.session import Finding, Session
from tests.analysis.test_advice import cuda_session, fp16_findings
from tests.render.conftest import EVIL_MESSAGE, EVIL_MODULE, without_our_script

#: The topic sections (every report has them), from the section registry.
TOPICS = [(s.id, s.title, s.needs) for s in registry() if s.needs is not None]
#: The order an empty session's report shows, written out (the order before the registry).
SECTION_IDS = ["overview", "time", "precision", "numerics", "memory", "gradscaler", "environment"]


def section_ids(html: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"[ >]', html)


def test_every_section_in_order_even_without_data() -> None:
    html = render_html(Session())
    assert section_ids(html) == SECTION_IDS
    assert html.count("No data for this section") == len(TOPICS)  # an empty session: all five
    nav = re.findall(r'<a href="#([^"]+)">', html.split("</nav>")[0])
    assert nav == SECTION_IDS


def test_findings_live_in_their_section_and_the_overview_links_them() -> None:
    session = cuda_session(True)
    odd = Finding("x-odd", "low", "A finding of an unknown section.", section="nowhere")
    session.findings = [*advise(session, fp16_findings()), odd]
    html = render_html(session)
    precision = html.split('<section id="precision">')[1].split("</section>")[0]
    assert 'id="finding-prefer-bf16"' in precision
    # The merged findings are cited inside, as details, once, not as findings of their own.
    assert precision.count('<details class="merged">') == 4
    assert 'id="finding-fp16-grad-underflow"' not in html
    overview = html.split('<section id="overview">')[1].split("</section>")[0]
    assert 'href="#finding-prefer-bf16"' in overview
    assert "Top recommendations" in overview
    # Unknown sections' findings are shown in full in the overview.
    assert 'id="finding-x-odd"' in overview
    anchors = re.findall(r' id="([^"]+)"', html)
    assert len(anchors) == len(set(anchors))
    for target in re.findall(r'href="#([^"]+)"', html):
        assert target in anchors or target == "top"


def test_user_strings_are_escaped_and_nothing_loads_from_the_network() -> None:
    session = Session(
        status="error",
        error={"type": "RuntimeError", "message": EVIL_MESSAGE, "traceback": EVIL_MESSAGE},
        environment={"device_name": EVIL_MODULE},
        sections={
            "profiler": {
                "top_ops": [
                    {"name": EVIL_MODULE, "calls": 1, "self_cpu_us": 1.0, "self_device_us": 0.0}
                ],
                "trace_files": [EVIL_MODULE],
            },
            "speed_probe": {
                "fp32_ms": 1.0,
                "autocast_ms": 2.0,
                "autocast": "cpu:bfloat16",
                "modules": [{"module": EVIL_MODULE, "fp32_ms": 1.0, "autocast_ms": 2.0}],
            },
        },
        findings=[Finding("x", "high", EVIL_MODULE, {EVIL_MODULE: EVIL_MESSAGE}, EVIL_MODULE)],
    )
    html = render_html(session)
    assert EVIL_MODULE not in html and "<script" not in without_our_script(html).lower()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp and "default-src 'none'" in csp.group(1)
    # scripts: only ours, by its hash (no 'unsafe-inline', no source to fetch from)
    (allowed,) = re.findall(r"script-src ([^;]+)", html_lib.unescape(csp.group(1)))
    assert re.fullmatch(r"'sha256-[A-Za-z0-9+/=]+'", allowed.strip()), allowed
    # ... and the hash is the one of the script the page carries (hashed here, from the page)
    (script,) = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    assert allowed.strip() == f"'sha256-{digest}'"
    # Every src/href is a data: URI or an in-page anchor, or the trace file beside the report
    # (a path with no scheme or host: nothing on the network).
    for tag, attr in re.findall(r'<(\w+)[^>]*?(?:src|href)="([^"]*)"', html):
        trace_link = tag == "a" and ":" not in attr and not attr.startswith("//")
        assert trace_link or attr.startswith(("data:image/svg+xml;base64,", "#")), attr


def test_sections_keep_the_order_the_report_had() -> None:
    from markupsafe import Markup

    from ampdiag.render.html import arrange
    from ampdiag.render.sections import ReportSection

    # the order html._ORDER gave before the registry (precision-ab after the topics)
    shown = ["overview", "ranks", "time", "timeline", "precision", "numerics", "memory"]
    shown += ["gradscaler", "precision-ab", "environment"]
    built = [ReportSection(id=i, title=i, html=Markup("")) for i in reversed(shown)]
    built.insert(3, ReportSection(id="mine", title="mine", html=Markup("")))
    assert [s.id for s in arrange(Session(), built)] == [*shown[:-1], "mine", "environment"]


def _policy(page: str) -> str:
    found = re.findall(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert len(found) == 1, found
    return html_lib.unescape(str(found[0]))


def test_every_page_has_the_one_shell_and_policy() -> None:
    from ampdiag.analysis.diff import diff
    from ampdiag.render.diff import diff_html
    from ampdiag.render.html import fallback_html

    report = render_html(Session())
    pages = [
        fallback_html(Session(), ValueError(EVIL_MESSAGE)),
        diff_html(diff(Session(), Session())),
    ]
    expected = _policy(report)
    for directive in ("default-src 'none'", "script-src 'sha256-", "connect-src 'none'"):
        assert directive in expected
    # the same policy, but that the pages with no script of ours allow none at all
    ours = re.search(r"script-src [^;]+;", expected)
    assert ours is not None
    for page in pages:
        policy = _policy(page)
        assert policy.replace("script-src 'none';", ours.group(0)) == expected
        assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()


def test_the_settings_section_names_what_was_changed() -> None:
    config = {"profile": True, "sample_every": 1, "profile_active": 3, EVIL_MODULE: 1}
    html = render_html(Session(config=config))
    part = html[html.index('<section id="settings"') : html.index('<section id="environment"')]
    rows = re.findall(r"<tr><th><code>([^<]+)</code></th><td>([^<]*)</td><td>([^<]*)</td>", part)
    # by hand: DiagnoseConfig's defaults are sample_every=0, profile=True, profile_active=3
    assert rows[0] == ("sample_every", "1", "default 0")
    assert {r[0] for r in rows[1:]} == {
        "profile",
        "profile_active",
        EVIL_MODULE.replace("<", "&lt;").replace(">", "&gt;"),
    }
    assert "1 changed from the default" in part and EVIL_MODULE not in part
    assert '<section id="settings"' not in render_html(Session())  # a trace's session: none


def test_a_real_runs_environment_names_the_model_it_trained(evil_run: Session) -> None:
    """Truth: the model's own parameter count (the optimizer updates all of them). The section
    once failed ("could not be rendered") for every model that has no frozen copy."""
    from tests.render.conftest import evil_model

    html = render_html(evil_run)
    env = html.split('<section id="environment"', 1)[1].split("</section>", 1)[0]
    n = sum(p.numel() for p in evil_model().parameters())
    assert "could not be rendered" not in env
    assert f"<code>Sequential</code> ({n:,} parameters, " in env, env[-1500:]
