"""Readable evidence everywhere (#16): units humanized, no raw dicts or None, device columns only
with a device, and every merged finding's fix under its recommendation."""

from __future__ import annotations

from ampdiag import units
from ampdiag.analysis.advisors import advise
from ampdiag.render.console import summary
from ampdiag.render.html import render_html
from ampdiag.render.tensorboard import finding_markdown
from ampdiag.session import Finding, Session
from tests.analysis.test_advice import cuda_session, fp16_findings


def test_units() -> None:
    assert units.nbytes(134179704) == "128.0 MiB"
    assert units.nbytes(512) == "512 B"
    assert units.flops(318898176) == "318.9 MFLOP"
    assert units.flops(2.5e12) == "2.5 TFLOP"
    assert units.micros(3.83e6) == "3.83 s"
    assert units.micros(12_500) == "12.50 ms"
    assert units.micros(840) == "840.0 µs"
    assert units.percent(0.31) == "31.0%"
    assert units.count(1234567) == "1,234,567"
    for fmt in (units.nbytes, units.flops, units.micros, units.percent, units.count):
        assert fmt(None) == "not measured"
    assert units.by_key("peak_bytes", 3 * 1024**2) == "3.0 MiB"
    assert units.by_key("step_ms", 3830.0) == "3.83 s"
    assert units.by_key("underflow_fraction", 0.5) == "50.0%"
    assert units.by_key("matmul_flops", 2e9) == "2.0 GFLOP"
    assert units.by_key("x", None) == "not measured"
    assert units.by_key("x", {"a_bytes": 2048, "b": None}) == "A memory: 2.0 KiB; B: not measured"


def test_evidence_tables_have_no_raw_dicts_or_none() -> None:
    f = Finding(
        "x",
        "high",
        "t",
        {"peak_bytes": 134179704, "flops": 318898176, "gap": None, "by": {"a_bytes": 1024}},
        section="time",
    )
    html = render_html(Session(findings=[f]))
    evidence = html.split('id="finding-x"')[1].split("</article>")[0]
    assert "128.0 MiB" in evidence and "318.9 MFLOP" in evidence
    assert "not measured" in evidence and "A memory: 1.0 KiB" in evidence
    table = evidence.split('<details class="raw">')[0]  # the raw values are one click away
    assert "None" not in table and "{" not in table and "134179704" not in table
    assert "134179704" in evidence.split('<details class="raw">')[1]
    md = finding_markdown(f)
    assert "128.0 MiB" in md and "None" not in md and "134179704" not in md


def test_device_columns_only_where_there_is_a_device() -> None:
    def top(device_us: float) -> str:
        op = {"name": "aten::mm", "calls": 3, "self_cpu_us": 5.0, "self_device_us": device_us}
        html = render_html(Session(sections={"profiler": {"top_ops": [op]}}))
        return html.split('<section id="time">')[1].split("</section>")[0]

    assert "self device" not in top(0.0)  # a CPU run: no "self device 0.0 µs" column
    assert "self device" in top(12.0)


def test_merged_findings_fixes_show_under_the_recommendation() -> None:
    findings = fp16_findings()
    findings[1].fix = 'scaler = torch.amp.GradScaler("cuda")'
    session = cuda_session(True)
    session.findings = advise(session, findings)
    (rec,) = [f for f in session.findings if f.evidence.get("merged")]
    html = render_html(session)
    assert html.count("torch.amp.GradScaler(&#34;cuda&#34;)") >= 1
    assert "Also, for <code>grad-scaler-missing</code>" in html
    text = summary(session)
    assert "fix for grad-scaler-missing: " in text or "fix for grad-scaler-missing:" in text
    assert 'scaler = torch.amp.GradScaler("cuda")' in text
    assert 'torch.amp.GradScaler("cuda")' in finding_markdown(rec)
