"""The Jinja environment every HTML template renders through: autoescaping always on."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2
from markupsafe import Markup

from ampdiag import units as humanize


def _evidence(value: Any, key: str = "") -> str:
    """An evidence value as text, formatted by its key (see `ampdiag.render.humanize`)."""
    return humanize.by_key(str(key), value)


def merged_fixes(finding: Any) -> list[tuple[str, str]]:
    """(id, fix) of each finding a recommendation merged, whose fix it does not already say.

    A recommendation like ``prefer-bf16`` explains others (``grad-scaler-disabled``...); their
    own fixes still apply and are shown under it, each once.
    """
    seen = {str(getattr(finding, "fix", "") or "").strip()}
    out: list[tuple[str, str]] = []
    evidence = getattr(finding, "evidence", None)
    merged = evidence.get("merged") if isinstance(evidence, dict) else None
    for m in merged if isinstance(merged, list) else []:
        fix = str(m.get("fix") or "").strip() if isinstance(m, dict) else ""
        if fix and fix not in seen:
            seen.add(fix)
            out.append((str(m.get("id")), fix))
    return out


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared environment (templates from ampdiag/render/templates, autoescape on)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ampdiag.render", "templates"),
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
    env.filters["merged_fixes"] = merged_fixes
    return env


def render_template(name: str, **context: Any) -> Markup:
    """Renders a template to escaped HTML markup."""
    return Markup(environment().get_template(name).render(**context))
