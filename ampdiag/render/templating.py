"""The Jinja environment every HTML template renders through: autoescaping always on."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import jinja2
from jinja2.bccache import Bucket
from markupsafe import Markup

from ampdiag import units as humanize


def _evidence(value: Any, key: str = "") -> str:
    """An evidence value as text, formatted by its key (see `ampdiag.render.humanize`)."""
    return humanize.by_key(str(key), value)


def _raw_json(evidence: Any) -> str:
    """The evidence as stored in session.json (without the merged findings, shown apart)."""
    import json

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


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Jinja's own cache of compiled templates, which never fails a render.

    Compiling the report's templates (parse, generate, ``compile()``) costs each process about
    0.1 s of the user's exit, for the same templates every time. Jinja keeps the compiled code
    in its private temporary folder (``_jinja2-cache-<uid>``, mode 0700, owner checked), keyed
    by the template's path and checked against its source's SHA-1 and the Python version, so
    an edited template or another interpreter compiles afresh. A cache that cannot be read or
    written only costs the compile.
    """

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except Exception:
            return


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    try:
        return _CompiledTemplates(pattern="__ampdiag_%s.cache")
    except Exception:  # no safe temporary folder: compile every time
        return None


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared environment (templates from ampdiag/render/templates, autoescape on)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ampdiag.render", "templates"),
        bytecode_cache=_bytecode_cache(),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["us"] = humanize.micros
    env.filters["bytes"] = humanize.nbytes
    env.filters["flops"] = humanize.flops
    env.filters["pct"] = humanize.percent
    env.filters["num"] = humanize.count
    env.filters["evidence"] = _evidence
    env.filters["label"] = humanize.label
    env.filters["rawjson"] = _raw_json
    env.filters["merged_fixes"] = merged_fixes
    return env


def render_template(name: str, **context: Any) -> Markup:
    """Renders a template to escaped HTML markup."""
    return Markup(environment().get_template(name).render(**context))


@lru_cache(maxsize=1)
def page_css() -> Markup:
    """The stylesheet every page carries inline (no network).

    Our own file, so it is not escaped (it has > and ").
    """
    return Markup(
        resources.files("ampdiag.render").joinpath("templates/report.css").read_text("utf-8")
    )


def page(title: str, body: Markup) -> str:
    """A whole HTML document in the one page shell (its CSS and Content-Security-Policy)."""
    return str(render_template("page.html.j2", page_title=title, body=body, css=page_css()))
