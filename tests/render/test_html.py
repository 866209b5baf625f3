"""The HTML report's structure, escaping and offline-ness (string level; the browser test opens
it for real)."""

from __future__ import annotations

import html as html_lib
import re

from ampdiag.analysis.advisors import advise
from ampdiag.render.html import TOPICS, render_html
from ampdiag.session import Finding, Session
from tests.analysis.test_advice import cuda_session, fp16_findings
from tests.render.conftest import EVIL_MESSAGE, EVIL_MODULE, without_our_script

SECTION_IDS = ["overview", *(t[0] for t in TOPICS), "environment"]


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
    # Every src/href is a data: URI or an in-page anchor, or the trace file beside the report
    # (a path with no scheme or host: nothing on the network).
    for tag, attr in re.findall(r'<(\w+)[^>]*?(?:src|href)="([^"]*)"', html):
        trace_link = tag == "a" and ":" not in attr and not attr.startswith("//")
        assert trace_link or attr.startswith(("data:image/svg+xml;base64,", "#")), attr
