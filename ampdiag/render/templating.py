"""The Jinja environment every HTML template renders through: autoescaping always on."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2
from markupsafe import Markup


def _fmt_us(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def _fmt_bytes(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
        v /= 1024
    return str(value)


def _fmt_pct(value: Any) -> str:
    try:
        return f"{float(value) * 100:.1f}%"
    except (TypeError, ValueError):
        return str(value)


def _fmt_evidence(value: Any) -> str:
    """An evidence value as text: numbers short, lists and objects as compact JSON."""
    import json

    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return "; ".join(value)
        return json.dumps(value, default=str)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


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
    env.filters["us"] = _fmt_us
    env.filters["bytes"] = _fmt_bytes
    env.filters["pct"] = _fmt_pct
    env.filters["evidence"] = _fmt_evidence
    return env


def render_template(name: str, **context: Any) -> Markup:
    """Renders a template to escaped HTML markup."""
    return Markup(environment().get_template(name).render(**context))
