"""Where the step time goes.

The host breakdown per step, step wall times, the top ops, and the speed probe (the same step
in FP32 and under autocast).
"""

from __future__ import annotations

import statistics
from typing import Any

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, stated, svg, templating
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import join, table
from ampdiag.session import Session

TITLE = "Step time"
NEEDS = "a profiled step (run at least skip + warm-up + 1 steps)"

#: At most this many per-step rows in the breakdown table (the chart shows every step).
TABLE_STEPS = 50


def categories(breakdown: dict[str, Any]) -> list[str]:
    """The breakdown's categories in the order the trace analysis wrote them."""
    return [str(c) for c in breakdown.get("share") or {}]


#: A step slower than this many times the median step lies above the step-time chart's scale.
OUTLIER_FACTOR = 10.0


def outlier_ceiling(values: list[float]) -> tuple[float | None, list[int]]:
    """The value axis' top, and the indices of the values above it ((None, []): none).

    It keeps outliers (a first step that compiles and warms up) from flattening the rest.
    """
    if len(values) < 3:
        return None, []
    median = statistics.median(values)
    limit = OUTLIER_FACTOR * median
    above = [i for i, v in enumerate(values) if v > limit]
    if not above or median <= 0:
        return None, []
    return 1.2 * max(v for v in values if v <= limit), above


def runs_of(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive integers grouped into (first, last) runs: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def figures(session: Session) -> dict[str, charts.Chart]:
    """The section's charts, by name (shared by the HTML and TensorBoard)."""
    prof = session.section("profiler")
    steps = [s for s in session.steps if isinstance(s.get("wall_s"), (int, float))]
    out: dict[str, charts.Chart] = {}
    breakdown = prof.get("breakdown", {})
    rows = breakdown.get("steps", [])
    if rows:
        series = {
            c: [float(r.get(f"{c}_us") or 0.0) / 1000 for r in rows] for c in categories(breakdown)
        }
        out["step-breakdown"] = charts.bars(
            [f"step {r['step']}" for r in rows],
            series,
            "ms",
            "Host time per profiled step",
            unit="steps",
        )
    if len(steps) >= 2:
        ms = [s["wall_s"] * 1000 for s in steps]
        profiled = [s["index"] for s in steps if s.get("profiled")]
        ymax, above = outlier_ceiling(ms)
        note = ", ".join(
            f"step {steps[i]['index']}: {humanize.micros(ms[i] * 1000)}" for i in above[:3]
        ) + (" (above the scale)" if above else "")
        out["step-times"] = charts.line(
            [s["index"] for s in steps],
            {"wall time": ms},
            "step",
            "ms",
            "Wall time per step (shaded: the steps the profiler recorded)",
            bands=[(a, b, "profiled") for a, b in runs_of(profiled)],
            ymax=ymax,
            note=note,
        )
    speed = stated.figures(session).get("speed_vs_fp32")
    if isinstance(speed, dict):
        by = "precision A/B" if speed.get("source") == "precision A/B" else "speed probe"
        out["speed-probe"] = charts.bars(
            ["FP32", stated.autocast(session) or "autocast"],
            {"ms": [float(speed["fp32_ms"]), float(speed["run_ms"])]},
            "ms per forward + backward (median of the samples)",
            f"The same step in FP32 and under autocast ({by})",
            horizontal=True,
        )
    return out


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The time section, when there are steps, a profile or a speed probe."""
    prof = session.section("profiler")
    probe = session.section("speed_probe")
    steps = session.steps
    if not prof and not steps and not probe.get("fp32_ms"):
        return None
    uris = {name: svg.inline(chart) for name, chart in figures(session).items()}
    breakdown = prof.get("breakdown", {})
    rows = breakdown.get("steps", [])
    top_ops = prof.get("top_ops") or []
    speed = stated.figures(session).get("speed_vs_fp32")
    autocast = stated.autocast(session) or "autocast"
    html = join(
        (
            _breakdown(prof, categories(breakdown), rows),
            templating.figures({k: v for k, v in uris.items() if k != "speed-probe"}),
            _top_ops(prof, any(float(op.get("self_device_us") or 0.0) > 0 for op in top_ops)),
            _trace_files(prof),
            Markup('<h3 id="speed-probe">Mixed precision vs FP32</h3>\n'),
            _speed(speed, probe, autocast, uris) if speed else _no_speed(probe),
        )
    )
    share = breakdown.get("share", {})
    summary = ", ".join(f"{c} {humanize.percent(share[c])}" for c in categories(breakdown))
    return ReportSection(id="time", title=TITLE, html=html, summary=summary, figures=list(uris))


def _breakdown(prof: Any, cats: list[str], rows: list[Any]) -> Markup:
    """The host time of each profiled step (up to `TABLE_STEPS`) by category, and the shares."""
    us = humanize.micros
    if not rows:
        if not prof:
            return Markup("")
        schedule = prof.get("schedule", {})
        return Markup(
            '<p class="muted">No step was profiled ({} steps ran; the profiler skips {} and warms '
            "up for {}).</p>\n"
        ).format(prof.get("steps_seen", 0), schedule.get("skip", "?"), schedule.get("warmup", "?"))
    kinds = "t" + "n" * (len(cats) + 1)
    cells = (
        [r["step"], us(r["total_us"]), *(us(r[c + "_us"]) for c in cats)]
        for r in rows[:TABLE_STEPS]
    )
    share = prof.get("breakdown", {})["share"]
    shares = [["share", "", *(humanize.percent(share[c]) for c in cats)]]
    tail = templating.rows("ht" + kinds[2:], shares, end="\n")
    if len(rows) > TABLE_STEPS:
        more = Markup(
            '<tr><td colspan="{}" class="muted">… and {} more steps (in the chart below and in '
            "session.json)</td></tr>"
        ).format(len(cats) + 2, len(rows) - TABLE_STEPS)
        tail = more + tail
    return Markup(
        "<p>Host time of the profiled steps (from the trace), split by what the process was "
        "doing.</p>\n{}"
    ).format(table(("step", "#total", *(f"#{c}" for c in cats)), kinds, cells, True, tail))


def _top_ops(prof: Any, device_column: bool) -> Markup:
    """The ops with the most self time (and device time, where the trace has it)."""
    if not prof.get("top_ops"):
        return Markup("")
    us = humanize.micros
    cells = (
        [op["name"], humanize.count(op["calls"]), us(op["self_cpu_us"])]
        + ([us(op["self_device_us"])] if device_column else [])
        for op in prof["top_ops"]
    )
    head = ("op", "#calls", "#self CPU", "#self device")[: 4 if device_column else 3]
    return Markup("<h3>Top ops by self time</h3>\n{}").format(
        table(head, "cnnn"[: len(head)], cells, True)
    )


def _trace_files(prof: Any) -> Markup:
    """Links to the trace files (a relative path only: nothing that could leave the folder)."""
    if not prof.get("trace_files"):
        return Markup("")
    link = Markup('<a class="trace" href="{0}" download><code>{0}</code></a> ')
    code = Markup("<code>{}</code> ")
    files = join(
        link.format(t) if ":" not in t and not t.startswith("//") else code.format(t)
        for t in prof["trace_files"]
    )
    return Markup(
        "<p>Trace of the profiled steps: {}(relative to this report's folder). To see it on a "
        'timeline, open Perfetto (<code>ui.perfetto.dev</code>, "Open trace file": the file is '
        "read in your browser and not uploaded) and choose this file; "
        "<code>chrome://tracing</code> reads it too.</p>"
    ).format(files)


_VERDICTS = {
    "faster": "faster than FP32",
    "slower": "slower than FP32",
    "tied": "as fast as FP32 within the spread",
}


def _speed(speed: Any, probe: Any, autocast: Any, uris: dict[str, Markup]) -> Markup:
    """The run's one autocast-vs-FP32 figure: the precision A/B's, else the speed probe's."""
    us = humanize.micros
    ab = speed["source"] == "precision A/B"
    if ab:
        out = [
            Markup(
                '<p>Measured by the precision A/B (<a href="#precision-ab">Which precision</a>): '
                "the model's forward + backward on a copy of the run's model with its own batch, "
                "in interleaved rounds until each median was tight: medians ± their median "
                "absolute deviation. This is the figure every part of the report states.</p>\n"
            )
        ]
    else:
        noisy = ""
        if probe.get("tight") is False:
            noisy = Markup(
                " (not within {} of the median before the budget ran out: a noisy measurement)"
            ).format("%.0f%%" % (probe.get("tolerance", 0.05) * 100))
        out = [
            Markup(
                "<p>The model's {} on the run's own batch, timed {} times each way, interleaved: "
                "medians ± their median absolute deviation{}.</p>\n"
            ).format(probe.get("measured", "forward + backward"), probe.get("repeats"), noisy)
        ]
    ratio = "{:.2f}×".format(speed["time_ratio"])
    spread = "{:.2f}–{:.2f}×".format(speed["low"], speed["high"])
    if ab:
        out.append(
            Markup(
                "<details><summary>autocast / FP32 time {} ({}): the table and chart</summary>"
            ).format(ratio, spread)
        )

    def spread_of(key: str) -> Any:
        v = speed.get(key)
        return Markup(" ± {}").format(us(v * 1000)) if isinstance(v, (int, float)) else ""

    out.append(
        Markup(
            '<table><tbody>\n<tr><th>FP32</th><td class="num">{}{}</td></tr>\n'
            '<tr><th><code>{}</code></th><td class="num">{}{}</td></tr>\n'
            '<tr><th>autocast / FP32 time</th><td class="num">{} ({}): {}</td></tr>\n'
            "</tbody></table>\n"
        ).format(
            us(speed["fp32_ms"] * 1000),
            spread_of("fp32_spread_ms"),
            autocast,
            us(speed["run_ms"] * 1000),
            spread_of("run_spread_ms"),
            ratio,
            spread,
            _VERDICTS[speed["verdict"]],
        )
    )
    if uris.get("speed-probe"):
        out.append(templating.figures({"speed-probe": uris["speed-probe"]}))
    if ab:
        out.append(Markup("</details>"))
    if probe.get("modules"):
        cells = (
            (m["module"], us(m["fp32_ms"] * 1000), us(m["autocast_ms"] * 1000))
            for m in probe["modules"]
        )
        out.append(
            Markup(
                "<details><summary>Leaf modules, forward only (largest slowdown first)</summary>\n"
                "{}</details>\n"
            ).format(table(("module", "#FP32", "#autocast"), "cnn", cells)[:-1])
        )
    return join(out)


def _no_speed(probe: Any) -> Markup:
    """Why there is no autocast-vs-FP32 figure."""
    if probe.get("error"):
        return Markup('<p class="muted">The speed probe failed: <code>{}</code></p>\n').format(
            probe["error"]
        )
    if probe.get("skipped"):
        return Markup('<p class="muted">The speed probe did not run: {}.</p>\n').format(
            probe["skipped"]
        )
    return Markup('<p class="muted">No speed probe in this session.</p>\n')
