"""The weight-updates section: BF16/FP16 weights an optimizer updates, and the updates lost.

Reads the ``weight_updates`` section (`ampdiag.sources.live.collectors.weight_updates`); shown
only when some optimizer updates parameters stored in BF16 or FP16 (the finding that advises
on it is ``low-precision-params``).
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import join, table
from ampdiag.session import Session

TITLE = "Weight updates"


@section(TITLE)
def build(session: Session) -> ReportSection | None:
    """The section, when an optimizer updates low-precision parameters."""
    sec = session.section("weight_updates")
    optimizers = [o for o in sec.get("optimizers") or [] if o.get("low_precision_params")]
    if not optimizers:
        return None
    share = sec.get("unchanged_share")
    html = _html(sec, optimizers, sec.get("params") or [])
    count = sum(int(o["low_precision_params"]) for o in optimizers)
    summary = f"{count} low-precision parameters updated" + (
        f", {humanize.percent(share)} of sampled updates lost" if share is not None else ""
    )
    return ReportSection(id="weight-updates", title=TITLE, html=html, summary=summary)


def _html(sec: Any, optimizers: list[Any], params: list[Any]) -> Markup:
    """Per optimizer the low-precision parameters it updates, and the updates lost to rounding."""
    num, pct = humanize.count, humanize.percent
    rows = []
    for o in optimizers:
        rows.append(
            Markup(
                "<tr><th><code>{}</code>{}</th><td>{} of {} parameters ({} values) in {}{}"
                "</td></tr>"
            ).format(
                o["optimizer"],
                Markup(" (lr {})").format(Markup(", ").join(o["lr"])) if o["lr"] else "",
                o["low_precision_params"],
                o["params"],
                num(o["low_precision_numel"]),
                Markup(", ").join(o["dtypes"]),
                Markup("; {} with an FP32 master copy in the optimizer (not counted)").format(
                    o["master_params"]
                )
                if o["master_params"]
                else "",
            )
        )
    out = [
        Markup(
            "<p>The optimizer updates weights stored in 16 bits: an update smaller than half a "
            "weight's spacing (BF16 keeps 8 significant bits, FP16 11) leaves it unchanged. "
            "Measured on {} sampled step(s), on up to {} values per parameter: the values whose "
            "gradient was nonzero and that the step left bit-for-bit unchanged.</p>\n"
            '<table class="evidence"><tbody>\n{}<tr><th>sampled updates that rounded away</th>'
            '<td class="num">{} ({} of {})</td></tr>\n</tbody></table>\n'
        ).format(
            sec.get("steps_measured", 0),
            num(sec.get("max_elements_per_param")),
            join(rows),
            pct(sec.get("unchanged_share")),
            num(sec.get("unchanged", 0)),
            num(sec.get("elements", 0)),
        )
    ]
    if params:
        cells = (
            (p["name"], p["dtype"], num(p["numel"]), num(p["elements"]), pct(p["unchanged_share"]))
            for p in params
        )
        out.append(Markup("<h3>Parameters losing the largest share of their updates</h3>\n"))
        out.append(table(("parameter", "dtype", *_COUNTS), "ctnnn", cells))
    if sec["steps"]:
        cells = (
            (s["step"], s["optimizer"], s["params"], num(s["elements"]), pct(s["unchanged_share"]))
            for s in sec["steps"]
        )
        out.append(Markup("<h3>Per sampled step</h3>\n"))
        out.append(table(("step", "optimizer", "#parameters", *_COUNTS[1:]), "tcnnn", cells))
    return join(out)


_COUNTS = ("#values", "#sampled updates", "#rounded away")
