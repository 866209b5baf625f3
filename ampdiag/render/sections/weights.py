"""The weight-updates section: BF16/FP16 weights an optimizer updates, and the updates lost.

Reads the ``weight_updates`` section (`ampdiag.sources.live.collectors.weight_updates`); shown
only when some optimizer updates parameters stored in BF16 or FP16 (the finding that advises
on it is ``low-precision-params``).
"""

from __future__ import annotations

from ampdiag import units as humanize
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import render_template
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
    html = render_template(
        "weights.html.j2", sec=sec, optimizers=optimizers, params=sec.get("params") or []
    )
    count = sum(int(o["low_precision_params"]) for o in optimizers)
    summary = f"{count} low-precision parameters updated" + (
        f", {humanize.percent(share)} of sampled updates lost" if share is not None else ""
    )
    return ReportSection(id="weight-updates", title=TITLE, html=html, summary=summary)
