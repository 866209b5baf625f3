"""The GradScaler: which scaler the run used, its settings, and the loss scale over the steps.

The scale history is read from the ``scaler`` section when a collector wrote one, as
``history: [{"step": int, "scale": float, "skipped": bool}, ...]``; the findings about the
scaler (missing, disabled, skipped steps, collapse, settings) are added by the report.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units
from ampdiag.render import charts, stated, svg, templating
from ampdiag.render.sections import ReportSection, section
from ampdiag.session import Session

TITLE = "GradScaler"
NEEDS = "a GradScaler in the run (scale history, skipped steps)"


def scale_history(session: Session) -> list[dict[str, Any]]:
    """The per-step loss scale records that have a numeric scale."""
    rows = session.section("scaler").get("history", [])
    if not isinstance(rows, list):
        return []
    return [
        r
        for r in rows
        if isinstance(r, dict)
        and isinstance(r.get("scale"), (int, float))
        and isinstance(r.get("step"), int)
    ]


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The GradScaler section, when the run had a scaler or fp16 autocast or scaler data."""
    run = session.section("run")
    scaler = run.get("scaler")
    history = scale_history(session)
    autocast = stated.autocast(session) or ""
    if not scaler and not history and not autocast.endswith(":float16"):
        return None
    figures: dict[str, Markup] = {}
    if len(history) >= 2:
        figures["loss-scale"] = svg.inline(
            charts.line(
                [r["step"] for r in history],
                {"loss scale": [float(r["scale"]) for r in history]},
                "step",
                "scale",
                "Loss scale per step (dashed: skipped steps)",
                marks=[r["step"] for r in history if r.get("skipped")],
                logy=True,
            )
        )
    told = stated.figures(session)
    counted = told.get("skipped_steps") or {}
    # totals over every step (the history is thinned on long runs), as every surface states them
    skipped = int(counted.get("skipped", sum(1 for r in history if r.get("skipped"))))
    html = _html(
        scaler,
        autocast,
        history,
        skipped,
        int(counted.get("steps") or len(history)),
        told.get("loss_scale") or {},
        figures,
    )
    state = {True: "enabled", False: "disabled"}
    summary = state[bool(scaler.get("enabled"))] if scaler else "no GradScaler"
    if history:
        summary += f", {skipped} skipped step{'s' if skipped != 1 else ''}"
    return ReportSection(
        id="gradscaler", title=TITLE, html=html, summary=summary, figures=list(figures)
    )


def _html(
    scaler: Any,
    autocast: str,
    history: list[dict[str, Any]],
    skipped: int,
    steps: int,
    scale: Any,
    figures: dict[str, Markup],
) -> Markup:
    """The scaler's settings, what it did over the steps, and the loss-scale chart."""
    out = []
    if scaler:
        rest = ((k, v) for k, v in scaler.items() if k not in ("class", "enabled", "device"))
        facts = (
            ("enabled", "yes" if scaler.get("enabled") else "no"),
            ("device", scaler.get("device") or "not recorded"),
        )
        out.append(
            Markup("<table><tbody>\n{}{}{}</tbody></table>\n").format(
                templating.rows("hc", [("class", scaler.get("class"))], end="\n"),
                templating.rows("ht", facts, end="\n"),
                templating.evidence_rows(rest),
            )
        )
        if not scaler.get("enabled"):
            out.append(
                Markup(
                    "<p>The scaler is <strong>disabled</strong>: it passes the loss through "
                    "unscaled and never skips a step. <code>torch.amp.GradScaler()</code> "
                    "defaults to "
                    '<code>"cuda"</code> and disables itself in a CPU run.</p>'
                )
            )
    elif autocast.endswith(":float16"):
        out.append(
            Markup(
                "<p>The run used <code>{}</code> autocast without a GradScaler: FP16 gradients "
                "below 2<sup>-24</sup> flush to zero.</p>\n"
            ).format(autocast)
        )
    if history:
        least = scale.get("min")
        smallest = (
            Markup(" (smallest {})").format(units.count(least))
            if isinstance(least, (int, float)) and least < scale.get("last", 0)
            else ""
        )
        out.append(
            Markup(
                "<p>{} steps seen, {} skipped (inf/NaN gradients); scale from {} to {}{}.</p>\n"
            ).format(
                units.count(steps),
                units.count(skipped),
                units.count(scale.get("first", history[0]["scale"])),
                units.count(scale.get("last", history[-1]["scale"])),
                smallest,
            )
        )
    out.append(templating.figures(figures))
    return templating.join(out)
