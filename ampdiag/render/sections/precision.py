"""The precision section: what ran in low precision and what in FP32, why, and where.

The summary it shows is the derive step's (``derived.precision``); this module only formats.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import figures as figure_tags
from ampdiag.render.templating import join, rows, table
from ampdiag.session import Session

TITLE = "Precision"
NEEDS = "the dtype audit of a sampled step under autocast"

MAX_MODULES = 20


def module_bars(modules: dict[str, dict[str, float]], limit: int = MAX_MODULES) -> charts.Chart:
    """Horizontal stacked bars: per module, op time in low precision and in FP32."""
    names = sorted(modules, key=lambda m: -(modules[m]["low_time_us"] + modules[m]["fp32_time_us"]))
    names = names[:limit]
    return charts.bars(
        names,
        {
            "low precision": [modules[m]["low_time_us"] / 1000 for m in names],
            "FP32": [modules[m]["fp32_time_us"] / 1000 for m in names],
        },
        "op time (ms)",
        "Low-precision vs FP32 work per module (audited step)",
        horizontal=True,
        colors=("#2ca02c", "#d62728"),
    )


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The precision section, when the run was audited (or says why it was not)."""
    sec = session.section("precision")
    if not sec:
        return None
    s = session.section("derived").get("precision")
    if not sec.get("audited") or s is None:
        reason = sec.get("not_audited_reason") or "the session was not analysed"
        html = Markup('<p class="muted">No step was audited: {}.</p>\n').format(reason)
        return ReportSection(id="precision", title=TITLE, html=html, summary="not audited")
    figures: dict[str, Markup] = {}
    if s.get("modules"):
        figures["precision-modules"] = svg.inline(module_bars(s["modules"]))
    html = _html(sec, s, figures)
    summary = (
        f"FP32 {humanize.percent(s['fp32_flops_share'])} of FLOPs, "
        f"{humanize.percent(s['fp32_time_share'])} of op time; "
        f"{humanize.count(s['casts']['total']['count'])} casts"
    )
    return ReportSection(
        id="precision", title=TITLE, html=html, summary=summary, figures=list(figures)
    )


def _cost(o: Any) -> tuple[str, str]:
    """An op's FLOPs and time."""
    return humanize.flops(o["flops"]), humanize.micros(o["time_us"])


_MATMUL = ("low_flops", "fp32_flops", "fp32_share")


def _html(sec: Any, s: Any, figures: dict[str, Markup]) -> Markup:
    """The audited step's FLOPs, op time and casts by precision, and why ops ran in FP32."""
    fl, us, pct, num = humanize.flops, humanize.micros, humanize.percent, humanize.count
    seen = join(
        Markup("<code>{}:{}</code> ").format(d, t)
        for d, t in sec.get("autocast_dtypes", {}).items()
    )
    shares = rows(
        "hnnn",
        (
            (name, f(low), f(fp32), pct(share))
            for name, f, low, fp32, share in (
                ("FLOPs", fl, s["flops"]["low"], s["flops"]["fp32"], s["fp32_flops_share"]),
                ("op time", us, s["time_us"]["low"], s["time_us"]["fp32"], s["fp32_time_share"]),
                ("matmul FLOPs", fl, *(s["matmul"][k] for k in _MATMUL)),
            )
        ),
        end="\n",
    )
    out = [
        Markup(
            "<p>Every ATen op of step {} (forward and backward, after autocast's casts), by the "
            "dtype it computed in. FLOPs count the ops torch's FLOP counter has formulas for "
            "(matmuls, convolutions, attention).</p>\n"
        ).format(sec["step"]),
        table(("", "#low precision", "#FP32", "#FP32 share"), "", "", True, shares),
        Markup("<p>Matmul FLOPs with autocast active: {}. Autocast dtypes seen: {}.</p>\n").format(
            pct(s["matmul"]["autocast_share"]), seen or "none"
        ),
        figure_tags(figures),
    ]
    if s["top_fp32_by_time"]:
        fixes = s.get("reason_fixes", {})
        ops = (
            [o["op"], o["module"], o["phase"], o["reason"], num(o["count"]), *_cost(o)]
            for o in s["top_fp32"]
        )
        why = (
            [r, num(v["count"]), fl(v["flops"]), us(v["time_us"]), fixes.get(r, "")]
            for r, v in s["reasons"].items()
        )
        out += [
            Markup("<h3>Top FP32 ops</h3>\n"),
            table(
                ("op", "module", "phase", "reason", "#calls", "#FLOPs", "#time"),
                "ccttnnn",
                ops,
                True,
            ),
            Markup("<h3>Why ops ran in FP32</h3>\n"),
            table(("reason", "#ops", "#FLOPs", "#time", "fix"), "tnnnp", why, True),
        ]
    casts = s["casts"]
    total = casts["total"]
    moved = humanize.nbytes
    per_step = ("per step", num(total["count"]), moved(total["bytes"]), us(total["time_us"]))
    out += [
        Markup(
            "<details><summary><strong>Casts</strong>: {} per step, {} moved</summary>\n"
        ).format(num(total["count"]), moved(total["bytes"])),
        table(
            ("inserted by", "#count", "#bytes moved", "#time"),
            "tnnn",
            (
                (origin, num(c["count"]), moved(c["bytes"]), us(c["time_us"]))
                for origin, c in casts.items()
                if origin != "total"
            ),
            True,
            rows("hnnn", [per_step], end="\n"),
        )[:-1],
        Markup("</details>\n"),
    ]
    if s["device_differences"]:
        keys = ("op", "module", "cpu_dtype", "cuda_policy", "cuda_dtype")
        diffs = ([*(d[k] for k in keys), num(d["count"])] for d in s["device_differences"])
        head = ("op", "module", "here (CPU)", "CUDA policy", "on CUDA", "#calls")
        out += [
            Markup(
                "<details><summary><strong>On CUDA these ops would run differently</strong> "
                "({} ops)</summary>\n<p>CUDA autocast's policy, derived from torch's own autocast "
                "registrations ({}).</p>\n"
            ).format(len(s["device_differences"]), sec["cuda_policy_source"]),
            table(head, "cctttn", diffs, True)[:-1],
            Markup("</details>\n"),
        ]
    if sec.get("reenabled_autocast_ops"):
        custom = join(Markup("<code>{}</code> ").format(o) for o in sec["reenabled_autocast_ops"])
        out.append(
            Markup(
                '<p class="muted">Custom ops run with autocast re-enabled inside the audit (as '
                "without it): {}</p>"
            ).format(custom)
        )
    return join(out)
