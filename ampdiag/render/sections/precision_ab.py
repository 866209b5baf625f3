"""Which precision for this model on this device: the A/B measurements side by side.

Reads the ``precisions`` part of the ``speed_probe`` section (what `ampdiag.compare` measured
on the run's own model and batch): per precision the forward + backward time with its spread,
the speed-up over FP32 (claimed only when the intervals do not overlap), activation memory,
and the numerical error against FP32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from ampdiag import units
from ampdiag.render import charts, svg, templating
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import join
from ampdiag.session import Session

TITLE = "Which precision"

NAMES = {"fp32": "FP32", "tf32": "TF32 matmuls", "bf16": "BF16 autocast",
         "fp16": "FP16 autocast + loss scale"}  # fmt: skip


def comparison(session: Session) -> Mapping[str, Any] | None:
    """The A/B measurements, when the run has them."""
    found = session.section("speed_probe").get("precisions")
    return found if isinstance(found, Mapping) and found.get("results") else None


def _db(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return units.NOT_MEASURED
    return "exact" if value >= 400.0 else f"{value:.1f} dB"  # passes.EXACT_SQNR_DB


def _speed(row: Mapping[str, Any]) -> str:
    speedup = row.get("speedup")
    if not isinstance(speedup, (int, float)):
        return "—" if row.get("precision") == "fp32" else units.NOT_MEASURED
    verdict = {True: "faster", False: "slower", None: "within the noise"}[row.get("faster")]
    low, high = row.get("speedup_low"), row.get("speedup_high")
    span = (
        f", {low:.2f}–{high:.2f}x"
        if isinstance(low, (int, float)) and isinstance(high, (int, float))
        else ""
    )
    return f"{speedup:.2f}x ({verdict}{span})"


def _criteria(ab: Mapping[str, Any]) -> str:
    c = ab.get("criteria")
    if not isinstance(c, Mapping):
        return ""
    return (
        f" Safe: nothing inf/NaN, the loss within {c.get('loss_rel_diff_max', 0):.0%} of FP32's, "
        f"at most {c.get('grad_underflow_max', 0):.0%} of the gradient values lost (FP16 at "
        f"the loss scale a GradScaler settles at), median gradient SQNR at least "
        f"{c.get('grad_sqnr_db_median_min', 0):.0f} dB. The recommendation is the fastest safe "
        "precision; among those its spread cannot order, the one with the least activation "
        "memory, then the simplest."
    )


def _modules(rows: list[Mapping[str, Any]]) -> Markup:
    """Where each low precision loses time, per leaf module: casts or the kernels themselves."""
    body = []
    for row in rows:
        for m in row.get("modules") or []:
            if not isinstance(m, Mapping) or "cause" not in m:
                continue
            body.append(
                [
                    NAMES.get(str(row.get("precision")), str(row.get("precision"))),
                    str(m.get("module")),
                    units.micros(float(m.get("fp32_ms", 0)) * 1e3),
                    units.micros(float(m.get("ms", 0)) * 1e3),
                    units.micros(float(m.get("cast_ms", 0)) * 1e3),
                    {"kernels": "slow low-precision kernels", "casts": "casts"}.get(
                        str(m.get("cause")), str(m.get("cause"))
                    ),
                ]
            )
    if not body:
        return Markup("")
    head = ("precision", "module", "FP32 forward", "forward", "of which casts", "extra time from")
    return Markup("<p>Modules slower than in FP32 (one forward each):</p>") + _table(head, body)


def _untimed(row: Mapping[str, Any]) -> str:
    """Why a row has no time: not run (and why), not timed (the budget), or failed."""
    if row.get("not_run"):
        return str(row["not_run"])
    return "not timed" if row.get("not_timed") else "failed"


def _cells(row: Mapping[str, Any]) -> list[str]:
    spread = row.get("time_spread_ms")
    time = units.micros((row.get("time_ms") or 0) * 1000) if row.get("time_ms") else None
    return [
        NAMES.get(str(row.get("precision")), str(row.get("precision"))),
        f"{time} ± {units.micros(spread * 1000)}" if time and spread else (time or _untimed(row)),
        _speed(row),
        units.nbytes(row.get("saved_bytes")),
        units.percent(row.get("loss_rel_diff")) if row.get("precision") != "fp32" else "—",
        _db(row.get("output_sqnr_db_min")) if row.get("precision") != "fp32" else "—",
        _db(row.get("grad_sqnr_db_min")) if row.get("precision") != "fp32" else "—",
        units.percent(row.get("grad_underflow")) if row.get("precision") != "fp32" else "—",
        {True: "yes", False: "no", None: units.NOT_MEASURED}[row.get("safe")],
    ]


HEAD = ("precision", "forward + backward", "vs FP32", "activations", "loss vs FP32",
        "worst output SQNR", "worst gradient SQNR", "gradients lost", "safe")  # fmt: skip


def _growth(layer: Mapping[str, Any]) -> str:
    """The largest amax growth of a layer's operands over the sampled steps, or not measured."""
    drift = layer.get("amax_drift")
    found = [
        (float(m["growth"]), op)
        for op, m in (drift.items() if isinstance(drift, Mapping) else ())
        if isinstance(m, Mapping) and isinstance(m.get("growth"), (int, float))
    ]
    if not found:
        return units.NOT_MEASURED
    growth, op = max(found)
    return f"{growth:.3g}x ({op.replace('_', ' ')})"


def _fp8(session: Session, ab: Mapping[str, Any]) -> Markup:
    """FP8 readiness: one row per Linear (verdict and why), the filter, the loss and speed."""
    fp8 = session.section("derived").get("fp8") or ab.get("fp8")
    if not isinstance(fp8, Mapping):
        return Markup("")
    if not fp8.get("layers"):
        why = fp8.get("skipped") or fp8.get("error") or "no nn.Linear ran"
        return Markup("<h3>FP8 readiness</h3><p>Not measured: {}.</p>").format(why)
    head = ("Layer", "Verdict", "Output SQNR", "Input grad SQNR", "Weight grad SQNR",
            "Input below normal", "Input amax", "Amax growth", "Why")  # fmt: skip
    rows = [
        [
            la.get("name"),
            "FP8-safe" if la.get("verdict") == "fp8-safe" else "keep in BF16",
            _db(la.get("output_sqnr_db")),
            _db(la.get("grad_input_sqnr_db")),
            _db(la.get("grad_weight_sqnr_db")),
            f"{la.get('input', {}).get('low_share', 0):.1%}",
            f"{la.get('input', {}).get('amax', 0):.3g}",
            _growth(la),
            "; ".join(la.get("reasons") or []) or "—",
        ]
        for la in fp8["layers"]
        if isinstance(la, Mapping)
    ]
    diff = fp8.get("loss_rel_diff_vs_bf16")
    loss = f"{diff:.2%}" if isinstance(diff, (int, float)) else units.NOT_MEASURED
    return Markup(
        "<h3>FP8 readiness ({} recipe)</h3><p>Convert {} of {} Linear layers; the converted "
        "model's loss differs from BF16's by {} on this batch; {}. Amax growth: the largest "
        "factor by which a sampled step's amax exceeded every earlier one's ({}).</p>"
        "{}<pre>{}</pre>"
    ).format(
        fp8.get("recipe"),
        len(fp8.get("convert") or []),
        len(rows),
        loss,
        fp8.get("speed", ""),
        fp8.get("amax_drift", units.NOT_MEASURED),
        _table(head, rows),
        fp8.get("filter", ""),
    )


def _table(head: tuple[str, ...], rows: list[list[Any]] | list[list[str]]) -> Markup:
    return Markup("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>").format(
        join(Markup("<th>{}</th>").format(h) for h in head), templating.rows("t" * len(head), rows)
    )


def figures(session: Session) -> dict[str, charts.Chart]:
    """The time of each precision the A/B timed (shared by the HTML and `ampdiag.plot`)."""
    rows = (comparison(session) or {}).get("results", [])
    timed = [
        r for r in rows if isinstance(r, Mapping) and isinstance(r.get("time_ms"), (int, float))
    ]
    if not timed:
        return {}
    chart = charts.bars(
        [NAMES.get(str(r["precision"]), str(r["precision"])) for r in timed],
        {"ms": [float(r["time_ms"]) for r in timed]},
        "ms per forward + backward",
        "Forward + backward time by precision (median)",
        horizontal=True,
    )
    return {"precision-ab": chart}


@section(TITLE)
def build(session: Session) -> ReportSection | None:
    """The section, when the run measured the precisions."""
    ab = comparison(session)
    if ab is None:
        return None
    rows = [r for r in ab["results"] if isinstance(r, Mapping)]
    uris = {name: svg.inline(chart) for name, chart in figures(session).items()}
    parts = [
        Markup("<p><strong>Recommended: {}</strong>{}. {}</p>").format(
            NAMES.get(str(ab.get("recommended")), ab.get("recommended")),
            " (no other measured clearly faster or slower)" if ab.get("uncertain") else "",
            ab.get("reason", ""),
        ),
        _table(HEAD, [_cells(row) for row in rows]),
    ]
    parts.append(
        Markup(
            "<p>Measured on a copy of the run's model with its own batch, interleaved rounds "
            "until each median was known within 5% or the budget ({} of {}) was spent; "
            "± is the median absolute deviation. SQNR: signal-to-quantization-noise ratio against "
            "FP32 (higher is closer). Gradients lost: nonzero in FP32, zero here.{}</p>"
        ).format(
            units.micros((ab.get("spent_s") or 0) * 1e6),
            units.micros((ab.get("budget_s") or 0) * 1e6),
            _criteria(ab),
        )
    )
    parts.append(_modules(rows))
    parts.append(_fp8(session, ab))
    parts.append(templating.figures(uris))
    return ReportSection(
        id="precision-ab",
        title=TITLE,
        html=join(parts),
        summary=f"recommended {ab.get('recommended')}",
        figures=list(uris),
    )
