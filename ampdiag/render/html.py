"""The HTML report: one self-contained file (inline CSS, figures as data URIs, no network).

Layout: the overview first (the verdict in a sentence, the top recommendations with their fixes,
every finding in a table that links to it), then one section per topic -- time, precision,
numerics, memory, GradScaler -- and the environment. A topic no collector filled still gets its
section, saying what it would need, so the report's shape (and its anchors) never change. Each
finding is shown in full in its topic's section (anchor ``#finding-<id>``). The navigation is
anchors, the details are ``<details>`` elements, hover values are SVG ``<title>``s; one small
inline script (templates/report.js) sorts tables and zooms the step charts. The
Content-Security-Policy forbids every network access and every script but that one, by hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup

from ampdiag._layout import REPORT_FILE
from ampdiag.render.sections import ReportSection, build_sections, registry
from ampdiag.render.sections.overview import lead
from ampdiag.render.templating import (
    asset,
    document,
    evidence_rows,
    join,
    merged_fixes,
    page,
    raw_json,
)
from ampdiag.session import Finding, Session

TOP_RECOMMENDATIONS = 3


@dataclass
class ShownFinding:
    """A finding with its anchor in the report and the section that shows it in full."""

    f: Finding
    anchor: str
    section: str


def anchors(findings: list[Finding], shown_in: set[str]) -> list[ShownFinding]:
    """Unique anchors (``finding-<id>``, ``finding-<id>-2``...) and where each finding lives."""
    seen: dict[str, int] = {}
    out = []
    for f in findings:
        n = seen[f.id] = seen.get(f.id, 0) + 1
        anchor = f"finding-{f.id}" if n == 1 else f"finding-{f.id}-{n}"
        out.append(ShownFinding(f, anchor, f.section if f.section in shown_in else "overview"))
    return out


def _placeholder(topic: str, title: str, needs: str, session: Session) -> ReportSection:
    html = Markup('<p class="muted">No data for this section in this run: it needs {}.').format(
        needs
    )
    if session.environment.get("source") == "trace":
        html += Markup(" This report was made from a trace, which does not record it.")
    return ReportSection(id=topic, title=title, html=html + Markup("</p>"), summary="no data")


def arrange(session: Session, built: list[ReportSection]) -> list[ReportSection]:
    """Adds the missing topic sections and puts every section in report order.

    The order is `SECTION_MODULES`'; a section of no registered module (a caller's own) goes
    before the environment, which closes the report.
    """
    sections = list(built)
    have = {s.id for s in sections}
    # a CUDA snapshot has memory and nothing else: no empty live-run sections beside it
    snapshot = bool(session.section("memory").get("snapshot_file")) and not session.steps
    for section in registry():
        if section.needs is not None and section.id not in have and not snapshot:
            sections.append(_placeholder(section.id, section.title, section.needs, session))
    order = {section.id: i for i, section in enumerate(registry())}
    last = order.get("environment", len(order))
    return sorted(sections, key=lambda s: order.get(s.id, last - 0.5))


SCRIPT_SHA256 = "UxtKtjFezgQplzENXv9rHaFuvsI75RjTSVwkUPIQ/Vs="
"""templates/report.js's SHA-256 (base64): the page's policy allows this one script by it.

Written here rather than computed: importing hashlib (OpenSSL) and base64 cost every report
~3 ms. test_html hashes the script the page carries, so an edited script fails the tests
instead of being blocked in the reader's browser.
"""


def script_and_hash() -> tuple[Markup, str]:
    """The report's one script and its CSP source (``'sha256-...'``).

    The policy allows exactly this script and no other, inline or fetched.
    """
    return asset("report.js"), f"'sha256-{SCRIPT_SHA256}'"


def finding_html(
    f: Finding, anchor: str, link: str = "", lead: Finding | None = None, folded: bool = False
) -> Markup:
    """A finding as an ``<article>``: in full where ``anchor`` is its id in the page, else a copy.

    A copy (the overview's top list) folds its evidence and links to the full one (``link``);
    ``folded``: the full one folds its evidence and fix, which the top list already shows.
    """
    ev = f.evidence or {}
    out = [Markup('<article class="finding sev-{}"').format(f.severity)]
    if anchor:
        out.append(Markup(' id="{}"').format(anchor))
    out.append(
        Markup(
            '>\n  <p class="fhead"><span class="sev">{}</span> <code class="fid">{}</code>'
        ).format(f.severity, f.id)
    )
    if not anchor and link:
        out.append(Markup(' · <a href="#{}">details</a>').format(link))
    title = "The verdict above." if lead is not None and f is lead and not anchor else f.title
    out.append(Markup('</p>\n  <p class="ftitle">{}</p>\n').format(title))
    if folded:
        out.append(_FOLDED)
    # An info finding is said by its title; its numbers stay one click away, as in a copy.
    fold_evidence = not anchor or (f.severity == "info" and not folded)
    if ev:
        if fold_evidence:
            out.append(Markup('<details class="evidence"><summary>evidence</summary>'))
        out.append(Markup('  <table class="evidence"><tbody>\n'))
        out.append(evidence_rows((k, v) for k, v in ev.items() if k not in ("merged", "explains")))
        out.append(Markup("  </tbody></table>\n"))
        if anchor:
            raw = Markup(
                '<details class="raw"><summary>raw values</summary><pre>{}</pre></details>'
            )
            out.append(raw.format(raw_json(ev)))
        if fold_evidence:
            out.append(Markup("</details>"))
    if ev.get("explains"):
        n = len(ev["explains"])
        codes = Markup(", ").join(Markup("<code>{}</code>").format(i) for i in ev["explains"])
        out.append(
            Markup('  <p class="explains">Explains {} finding{}: {}</p>\n').format(
                n, "s" if n != 1 else "", codes
            )
        )
        for m in ev.get("merged", []) if anchor else []:
            out.append(
                Markup(
                    '  <details class="merged"><summary><span class="sev sev-{0}">{0}</span> '
                    "<code>{1}</code> {2}</summary>\n"
                    '  <table class="evidence"><tbody>{3}</tbody></table>\n  </details>\n'
                ).format(
                    m["severity"], m["id"], m["title"], evidence_rows((m["evidence"] or {}).items())
                )
            )
    fold_fix = not anchor and f.severity in ("low", "info")
    if f.fix:
        head = '<details class="evidence"><summary>fix</summary>' if fold_fix else _FIX
        out.append(Markup(head + '<pre class="fix">{}</pre>').format(f.fix))
        if fold_fix:
            out.append(Markup("</details>"))
    more = merged_fixes(f)
    if more and not anchor:
        out.append(
            Markup(
                '<details class="evidence"><summary>{} more fix{}, for the findings this '
                "explains</summary>"
            ).format(len(more), "es" if len(more) != 1 else "")
        )
    for mid, fix in more:
        also = Markup(
            '  <p class="fixlabel">Also, for <code>{}</code></p><pre class="fix">{}</pre>\n'
        )
        out.append(also.format(mid, fix))
    if more and not anchor:
        out.append(Markup("</details>"))
    if folded:
        out.append(Markup("</details>"))
    out.append(Markup("</article>"))
    return join(out)


_FIX = '<p class="fixlabel">Fix</p>'
_FOLDED = Markup(
    '<details class="evidence"><summary>evidence and fix (the fix is also under Top '
    "recommendations)</summary>"
)


def _meta(session: Session, title: str) -> Markup:
    """The header's line: what ran, the verdict (or the status), when, which ampdiag."""
    out = [Markup('<p class="meta">{} · ').format(title)]
    verdict = session.section("derived").get("verdict")
    status = session.status
    if verdict:
        out.append(
            Markup('verdict <span class="status verdict-{}">{}</span>').format(
                str(verdict).replace(" ", "-"), verdict
            )
        )
        if status != "ok":
            out.append(Markup(" · "))
    if status != "ok" or not verdict:
        out.append(Markup('status <span class="status status-{0}">{0}</span>').format(status))
    out.append(Markup(" · {} · ampdiag {}</p>\n").format(session.created, session.ampdiag_version))
    return join(out)


def _overview_lists(
    shown: list[ShownFinding], top: list[ShownFinding], titles: dict[str, str], lead: Finding | None
) -> Markup:
    """The overview's top recommendations and its table of every finding."""
    out = []
    if top:
        out.append(Markup('  <h3 id="recommendations">Top recommendations</h3>\n'))
        out += [finding_html(item.f, "", item.anchor, lead) for item in top]
    if len(shown) > len(top):
        row = Markup(
            '<tr class="sev-{0}"><td><span class="sev">{0}</span></td><td><a href="#{1}">'
            '<code>{2}</code></a></td><td>{3}</td><td><a href="#{4}">{5}</a></td></tr>'
        )
        out.append(
            Markup(
                '  <h3 id="findings">All findings</h3>\n  <table class="findings"><thead><tr>'
                "<th>severity</th><th>id</th><th>finding</th><th>section</th></tr></thead><tbody>\n"
            )
        )
        for item in shown:
            f = item.f
            said = "The verdict above." if lead is not None and f is lead else f.title
            section = titles.get(item.section, item.section)
            out.append(row.format(f.severity, item.anchor, f.id, said, item.section, section))
        out.append(Markup("  </tbody></table>\n"))
    elif not shown:
        out.append(Markup('  <p class="muted">No findings.</p>\n'))
    return join(out)


def render_html(session: Session, sections: list[ReportSection] | None = None) -> str:
    """Returns the report as one HTML document."""
    script, script_src = script_and_hash()
    sections = arrange(session, build_sections(session) if sections is None else sections)
    shown = anchors(session.findings, {s.id for s in sections} - {"overview"})
    by_section: dict[str, list[ShownFinding]] = {}
    for item in shown:
        by_section.setdefault(item.section, []).append(item)
    titles = {s.id: s.title for s in sections}
    env = session.environment
    title = " · ".join(str(x) for x in (env.get("device_name"), env.get("autocast") or None) if x)
    folder = str(session.path) if session.path is not None else "DIR"
    stated = lead(session)
    top = [s for s in shown if s.f.severity != "info"][:TOP_RECOMMENDATIONS]
    top_anchors = {item.anchor for item in top}
    nav = Markup('<li><a href="#{}">{}{}</a></li>')
    count = Markup(' <span class="count">{}</span>')
    out = [
        Markup('<body id="top">\n<header>\n  <h1>ampdiag report</h1>\n  '),
        _meta(session, title),
        Markup('  <nav aria-label="sections"><ul>\n'),
        join(
            nav.format(
                s.id, s.title, count.format(len(by_section[s.id])) if by_section.get(s.id) else ""
            )
            for s in sections
        ),
        Markup("  </ul></nav>\n</header>\n<main>\n"),
    ]
    for s in sections:
        fold = ' data-fold="closed"' if s.id in ("environment", "settings") else ""
        summary = (
            Markup(' <span class="summary">{}</span>').format(s.summary)
            if s.summary and s.id != "overview"
            else ""
        )
        out.append(
            Markup('<section id="{}"' + fold + ">\n  <h2>{}{}</h2>\n  {}\n").format(
                s.id, s.title, summary, s.html
            )
        )
        if s.id == "overview":
            out.append(_overview_lists(shown, top, titles, stated))
        if by_section.get(s.id):
            out.append(Markup('  <div class="section-findings">\n'))
            if s.id == "overview":
                out.append(Markup("<h3>Other findings</h3>"))
            out += [
                finding_html(item.f, item.anchor, "", stated, item.anchor in top_anchors)
                for item in by_section[s.id]
            ]
            out.append(Markup("  </div>\n"))
        if s.id != "overview":
            out.append(Markup('<p class="totop"><a href="#top">↑ top</a></p>'))
        out.append(Markup("</section>\n"))
    out.append(
        Markup(
            "</main>\n<footer><p>Written by ampdiag {} from <code>session.json</code>; re-render "
            "with <code>ampdiag report {}</code>. This file loads nothing from the network.</p>"
            "</footer>\n<script>{}</script>\n</body>\n"
        ).format(session.ampdiag_version, folder, script)
    )
    head = Markup("ampdiag report — {}").format(title) if title else "ampdiag report"
    return document(head, join(out), script_src)


def fallback_html(session: Session, exc: BaseException) -> str:
    """A plain report (findings as text) for when the full one cannot be rendered at all.

    Each section already fails alone (`build_sections`); this is for a failure outside them,
    so that the user still gets the findings and the reason instead of no file.
    """
    article = Markup("<article><h3>{} <code>{}</code></h3><p>{}</p><pre>{}</pre></article>")
    body = Markup(
        "<h1>ampdiag report</h1><p>The full report could not be rendered from this session: "
        "<code>{}: {}</code>. The findings follow; everything collected is in "
        "<code>session.json</code>.</p>{}"
    ).format(
        type(exc).__name__,
        str(exc),
        join(article.format(f.severity, f.id, str(f.title), str(f.fix)) for f in session.findings),
    )
    return page("ampdiag report", body)


def write_html(session: Session, out: Path) -> Path:
    """Writes out/report.html and returns its path (a plain one if the full one fails)."""
    target = out / REPORT_FILE
    tmp = target.with_suffix(".html.tmp")
    try:
        text = render_html(session)
    except Exception as exc:
        text = fallback_html(session, exc)
    # errors="replace": a lone surrogate (a name decoded with surrogateescape, say) becomes "?"
    # instead of costing the whole file.
    tmp.write_bytes(text.encode("utf-8", errors="replace"))
    tmp.replace(target)
    return target
