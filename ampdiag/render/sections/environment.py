"""The run's environment, settings and what diagnose() found by itself."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import evidence_rows, join, rows
from ampdiag.session import Session

TITLE = "Run and environment"


@section(TITLE)
def build(session: Session) -> ReportSection:
    """The environment section (always present)."""
    out = [
        Markup("<table><tbody>\n"),
        evidence_rows(session.environment.items()),
        Markup("</tbody></table>\n"),
    ]
    run = session.section("run")
    if run:
        out.append(_found(session, run))
    error = session.error
    if error and error.get("traceback"):
        out.append(Markup("<h3>Error</h3><pre>{}</pre>").format(error["traceback"]))
    return ReportSection(id="environment", title=TITLE, html=join(out))


def _found(session: Session, run: Any) -> Markup:
    """What diagnose() found in the run: models, optimizers, the scaler, autocast, warnings."""
    comma = Markup(", ")
    models = []
    for m in run.get("models", []):
        frozen = ""
        if m.get("frozen_parameters"):  # only a model with frozen copies (an EMA) has them
            frozen = Markup(" updated by the optimizer, {} frozen{}").format(
                units.count(m["frozen_parameters"]),
                Markup(" in {}").format(comma.join(m["frozen_in"])) if m.get("frozen_in") else "",
            )
        models.append(
            Markup("<code>{}</code> ({} parameters{}, {}) ").format(
                m["class"], units.count(m["parameters"]), frozen, comma.join(m["param_dtypes"])
            )
        )
    sc = run.get("scaler")
    scaler: Any = "none"
    if sc:
        device = Markup(", device {}").format(sc["device"]) if sc.get("device") else ""
        scaler = Markup("<code>{}</code>, {}{}").format(
            sc.get("class"), "enabled" if sc.get("enabled") else "disabled", device
        )
    seen = (run.get("autocast_seen") or {}).items()
    autocast = comma.join(
        Markup("<code>{}</code> ({})").format(k, units.by_key("", v)) for k, v in seen
    )
    found = (
        ("models", join(models)),
        ("optimizers", comma.join(run.get("optimizers", [])) or "none found"),
        ("GradScaler", scaler),
        ("autocast seen", autocast or "none"),
        ("steps", len(session.steps)),
    )
    out = [
        Markup("<h3>Found in the run</h3>\n<table><tbody>\n{}</tbody></table>\n").format(
            rows("ht", found, end="\n")
        )
    ]
    if run.get("warnings"):
        items = join(Markup("<li>{}</li>").format(w) for w in run["warnings"])
        out.append(Markup("<h3>Warnings</h3><ul>{}</ul>").format(items))
    return join(out)
