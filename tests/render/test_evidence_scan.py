"""Evidence a person reads: no snake_case key, no scientific notation, no byte count without a
unit, outside code blocks — scanned in the HTML of real runs and of a real GPU trace, with the
raw values still one click away.
"""

from __future__ import annotations

import html as html_lib
import re

import pytest
import torch

import ampdiag
from ampdiag.analysis import analyze
from ampdiag.render.html import render_html
from ampdiag.session import Session
from ampdiag.sources.live.diagnosis import Diagnosis
from ampdiag.sources.traces import session_from_traces
from tests.conftest import REPO, train

SNAKE = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")
SCIENTIFIC = re.compile(r"\b\d+(?:\.\d+)?e[+-]?\d+\b", re.IGNORECASE)
RAW_BYTES = re.compile(r"\b\d{4,} B\b")


def _readable_text(page: str) -> str:
    """The page's visible text outside code: no <pre>, <code>, raw-values details, style."""
    for tag in ("style", "pre", "code", "script"):
        page = re.sub(rf"<{tag}\b.*?</{tag}>", " ", page, flags=re.S)
    page = re.sub(r'<details class="raw">.*?</details>', " ", page, flags=re.S)
    page = re.sub(r"<[^>]+>", " ", page)  # tags and their attributes (data URIs included)
    return html_lib.unescape(page)


def _evidence_headers(page: str) -> list[str]:
    return [
        html_lib.unescape(re.sub(r"<code>.*?</code>", "", h))
        for table in re.findall(r'<table class="evidence">(.*?)</table>', page, flags=re.S)
        for h in re.findall(r"<th>(.*?)</th>", table, flags=re.S)
    ]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("scan")
    runs: dict[str, Session] = {}
    quiet = {"console": False, "tensorboard": False, "report": False}
    made: dict[str, Diagnosis] = {}
    for name, dtype, scaler in (
        ("fp16-no-scaler", torch.float16, False),
        ("fp16-scaler", torch.float16, True),
        ("bf16", torch.bfloat16, False),
    ):

        def wrap(name: str = name) -> object:
            made[name] = ampdiag.diagnose(out=out / name, **quiet)
            return made[name]

        train(steps=12, dtype=dtype, use_scaler=scaler, wrap=wrap)
        runs[name] = made[name].session
    trace = session_from_traces(REPO / "tests/data/traces/critical_path/alexnet")
    trace.findings = analyze(trace)
    runs["a100-trace"] = trace
    return {name: render_html(s) for name, s in runs.items()}


def test_evidence_keys_are_words(pages: dict[str, str]) -> None:
    for name, page in pages.items():
        headers = _evidence_headers(page)
        assert headers, name  # every one of these runs has findings with evidence
        assert [h for h in headers if "_" in h] == [], name


def test_no_scientific_notation_or_raw_byte_counts(pages: dict[str, str]) -> None:
    for name, page in pages.items():
        text = _readable_text(page)
        assert SCIENTIFIC.findall(text) == [], name
        assert RAW_BYTES.findall(text) == [], name


def test_the_raw_values_are_one_click_away(pages: dict[str, str]) -> None:
    page = pages["fp16-no-scaler"]
    raw = re.findall(
        r'<details class="raw"><summary>raw values</summary><pre>(.*?)</pre>', page, re.S
    )
    assert raw and any(SNAKE.search(html_lib.unescape(r)) for r in raw)


def test_small_numbers_read_without_an_exponent() -> None:
    from ampdiag import units

    assert units.count(2.0**-22) == "2^-22"  # a loss scale
    assert units.count(0.000238) == "0.000238"
    assert float(units.count(3.14159e-6)) == pytest.approx(3.14e-6, rel=1e-2)


def test_keys_read_as_words() -> None:
    from ampdiag import units

    assert units.label("peak_bytes") == "Peak memory"
    assert units.label("step_ms") == "Step time"
    assert units.label("fp16_params") == "FP16 params"
