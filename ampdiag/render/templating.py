"""The parts every HTML page ampdiag writes is built from: the page shell and shared pieces.

Plain Python over markupsafe's `Markup`, which escapes whatever is not already markup (the
arguments of ``Markup(...).format``, the items of ``Markup("").join``): no template engine to
import, parse or compile at run time. A report of a trace is read by a user who waits for it,
and a template engine's import alone cost about as long as rendering the whole report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from markupsafe import Markup

from ampdiag import units

ASSETS = Path(__file__).with_name("templates")
"""The page's own stylesheet and script (``report.css``, ``report.js``)."""

_ROW = Markup("<tr><th>{}</th><td>{}</td></tr>")
_FIGURE = Markup('<figure class="figure" aria-label="{}">{}</figure>')


def join(parts: Iterable[Any]) -> Markup:
    """The parts as one piece of markup, each escaped unless it is markup already."""
    return Markup("").join(parts)


_CELLS = {
    "t": "<td>{}</td>",
    "n": '<td class="num">{}</td>',
    "c": "<td><code>{}</code></td>",
    "p": "<td><pre>{}</pre></td>",
    "h": "<th>{}</th>",
}
_TABLE = {
    False: Markup("<table><thead><tr>{}</tr></thead><tbody>\n{}{}</tbody></table>\n"),
    True: Markup("<table>\n<thead><tr>{}</tr></thead>\n<tbody>\n{}{}</tbody></table>\n"),
}


def rows(kinds: str, cells: Iterable[Iterable[Any]], end: str = "") -> Markup:
    """One ``<tr>`` per row of cells, each followed by ``end``.

    ``kinds`` has a letter per column: ``t`` text, ``n`` a number (right-aligned), ``c`` a name
    in ``<code>``, ``p`` preformatted (code to paste), ``h`` a row's heading (``<th>``).
    """
    row = Markup("<tr>" + "".join(_CELLS[k] for k in kinds) + "</tr>" + end)
    return join(row.format(*values) for values in cells)


def heads(*names: str) -> Markup:
    """The ``<th>`` cells of a header row; a name that starts with ``#`` heads a number column."""
    num, text = Markup('<th class="num">{}</th>'), Markup("<th>{}</th>")
    return join(num.format(n[1:]) if n.startswith("#") else text.format(n) for n in names)


def table(
    head: Iterable[str],
    kinds: str,
    cells: Iterable[Iterable[Any]],
    spaced: bool = False,
    tail: Any = "",
) -> Markup:
    """A table: its header row (`heads`), its rows (`rows`), then ``tail`` (rows of markup).

    ``spaced``: a line break after ``<table>`` and ``</thead>`` too.
    """
    return _TABLE[spaced].format(heads(*head), rows(kinds, cells), tail)


def evidence_rows(values: Iterable[tuple[Any, Any]]) -> Markup:
    """``<tr>`` rows of (key, value) pairs, each labelled and formatted by its key."""
    return join(_ROW.format(units.label(str(k), v), units.by_key(str(k), v)) for k, v in values)


def figures(uris: Mapping[str, Any]) -> Markup:
    """The inline figures, each in a ``<figure>`` labelled with its name."""
    return join(_FIGURE.format(name, uri) for name, uri in uris.items())


def raw_json(evidence: Any) -> str:
    """The evidence as stored in session.json (without the merged findings, shown apart)."""
    shown = (
        {k: v for k, v in evidence.items() if k != "merged"} if isinstance(evidence, dict) else {}
    )
    return json.dumps(shown, indent=1, default=str, allow_nan=True)


def merged_fixes(finding: Any) -> list[tuple[str, str]]:
    """(id, fix) of each finding a recommendation merged, whose fix it does not already say.

    A recommendation like ``prefer-bf16`` explains others (``grad-scaler-disabled``...); their
    own fixes still apply and are shown under it, each once. A fix is already said when its
    code is (`_said`): ``autocast-slower`` merged into ``prefer-bf16`` advises the same BF16
    training step, only its comments differ, and the reader should see that code once.
    """
    seen = {_said(str(getattr(finding, "fix", "") or ""))}
    out: list[tuple[str, str]] = []
    evidence = getattr(finding, "evidence", None)
    merged = evidence.get("merged") if isinstance(evidence, dict) else None
    for m in merged if isinstance(merged, list) else []:
        fix = str(m.get("fix") or "").strip() if isinstance(m, dict) else ""
        if fix and _said(fix) not in seen:
            seen.add(_said(fix))
            out.append((str(m.get("id")), fix))
    return out


def _said(fix: str) -> str:
    """What a fix tells the user to do: its lines without whole-line comments.

    A fix that is nothing but comments is all it says (its whole text).
    """
    lines = [line.rstrip() for line in fix.strip().splitlines()]
    kept = [line for line in lines if line and not line.lstrip().startswith("#")]
    return "\n".join(kept) if kept else "\n".join(lines)


@lru_cache(maxsize=2)
def asset(name: str) -> Markup:
    """Our own file in `ASSETS`, as markup: it is not escaped (it has > and ")."""
    return Markup((ASSETS / name).read_text("utf-8"))


def document(title: Any, body: Markup, script_src: str = "'none'") -> str:
    """A whole HTML document in the one page shell, around its ``<body>`` element.

    One Content-Security-Policy forbids every network access and every script but
    ``script_src`` (the report's own, allowed by its hash).
    """
    shell = Markup(
        "<!DOCTYPE html>\n"
        '<html lang="en">\n'
        "<head>\n"
        '<meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; script-src {}; '
        "connect-src 'none'; object-src 'none'; frame-src 'none'; font-src 'none'; "
        "media-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
        "form-action 'none'\">\n"
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>{}</title>\n"
        "<style>\n{}\n</style>\n"
        "</head>\n"
        "{}</html>"
    )
    return str(shell.format(script_src, title, asset("report.css"), body))


def page(title: str, body: Markup) -> str:
    """A plain page (the diff, the fallback report): ``body`` in its ``<main>``, no script."""
    return document(title, Markup("<body><main>{}</main></body>").format(body))
