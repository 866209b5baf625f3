"""The GPU timeline: idle / compute / non-compute per rank, kernels, precision, idle causes."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ampdiag import units
from ampdiag.render import charts, svg
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import figures as figure_tags
from ampdiag.render.templating import heads, join, rows, table
from ampdiag.session import Session

TITLE = "GPU timeline"

DETAIL_RANKS = 2
#: At most this many per-step rows per rank in the table.
TABLE_STEPS = 50
#: At most this many devices' memory curves per rank.
MEMORY_DEVICES = 4
#: A device's curve is drawn when its peak is at least this share of the rank's highest peak
#: (the table states every device's peak): a GPU trace's CPU allocations (8 bytes at most in
#: df_index_resolver) would take a chart of their own.
MEMORY_CHART_SHARE = 0.01


@section(TITLE)
def build(session: Session) -> ReportSection | None:
    """The timeline section, when the session has a ``timeline`` section with ranks."""
    tl = session.section("timeline")
    ranks: list[dict[str, Any]] = [r for r in tl.get("ranks", []) if isinstance(r, dict)]
    if not ranks:
        return None
    summary = tl.get("summary", {})
    gpu = [r for r in ranks if r.get("activities_in_window")]
    detail = gpu[:1]
    slow = next((r for r in gpu if r["rank"] == summary.get("slowest_rank")), None)
    if slow is not None and slow not in detail and len(detail) < DETAIL_RANKS:
        detail.append(slow)
    figures: dict[str, Markup] = {}
    if gpu:
        shown = gpu
        figures["gpu-time"] = svg.inline(
            charts.bars(
                [f"rank {r['rank']}" for r in shown],
                {
                    "compute": [r["compute_us"] / 1000 for r in shown],
                    "non-compute": [r["non_compute_us"] / 1000 for r in shown],
                    "idle": [r["idle_us"] / 1000 for r in shown],
                },
                "ms",
                "GPU time by rank",
                unit="ranks",
            )
        )
        top = detail[0]["top_kernels"][:10]
        if top:
            figures["top-kernels"] = svg.inline(
                charts.bars(
                    [k["short_name"][:50] for k in top],
                    {"ms": [k["total_us"] / 1000 for k in top]},
                    "ms",
                    f"Top kernels, rank {detail[0]['rank']}",
                    horizontal=True,
                )
            )
    cpu_only = [r for r in ranks if not r.get("activities_in_window")][:2]
    memory_figures = {
        r["rank"]: _memory_charts(r["memory"], r["rank"])
        for r in detail + cpu_only
        if r.get("memory")
    }
    parts = [_ranks_table(tl, ranks, summary), figure_tags(figures)]
    parts += [_rank_detail(r) for r in detail]
    parts += [_cpu_side(r) for r in cpu_only]
    for r in detail + cpu_only:
        parts += [_two_definitions(r), _memory(r, memory_figures.get(r["rank"], [])), _modules(r)]
    parts.append(_hta(tl.get("hta") or {}))
    html = join(parts)
    if gpu:
        r = gpu[0]
        text = (
            f"rank {r['rank']}: idle {units.percent(r['idle_share'])}, "
            f"compute {units.percent(r['compute_share'])}, "
            f"non-compute {units.percent(r['non_compute_share'])}"
        )
    else:
        text = "no GPU kernels (CPU side only)"
    names = [*figures, *(f"memory-rank-{k}" for k in memory_figures)]
    return ReportSection(id="timeline", title=TITLE, html=html, summary=text, figures=names)


def _memory_charts(memory: dict[str, Any], rank: int) -> list[Markup]:
    """Allocated (and reserved) MiB over the trace, one chart per device, the steps marked."""
    out = []
    top = max(d["peak"]["bytes"] for d in memory["devices"])
    shown = [d for d in memory["devices"] if d["peak"]["bytes"] >= MEMORY_CHART_SHARE * top]
    for d in shown[:MEMORY_DEVICES]:
        series = {"allocated": [v / 2**20 for v in d["allocated"]]}
        if d["reserved"] and any(d["reserved"]):
            series["reserved"] = [v / 2**20 for v in d["reserved"]]
        chart = charts.line(
            d["t_ms"],
            series,
            "ms",
            "MiB",
            f"Memory, rank {rank}, {d['device']}",
            marks=[s["start_ms"] for s in memory.get("steps", [])],
        )
        out.append(svg.inline(chart))
    return out


_us, _pct, _num, _bytes = units.micros, units.percent, units.count, units.nbytes


def _ranks_table(tl: Any, ranks: list[dict[str, Any]], summary: Any) -> Markup:
    """Each rank's span, idle, compute and non-compute time, and how the ranks compare."""
    out = [
        Markup(
            "<p>GPU time of the traced {}, in Holistic Trace Analysis' terms:\n"
            "<em>idle</em> (no kernel, memcpy or memset running), <em>compute</em> (computation "
            "kernels) and\n<em>non-compute</em> (communication, memory copies and sets not under "
            "computation), over the span from the first to the last GPU activity.</p>\n"
        ).format("ranks" if len(ranks) > 1 else "rank")
    ]
    if tl.get("warnings"):
        items = join(Markup("<li>{}</li>").format(w) for w in tl["warnings"])
        out.append(Markup('<ul class="warnings">{}</ul>').format(items))
    out.append(
        Markup(
            '<table>\n<thead><tr><th>rank</th><th>device</th><th class="num">span</th>'
            '<th class="num">idle</th><th class="num">compute</th><th class="num">non-compute</th>'
            '<th class="num">GPU activities</th><th>window</th></tr></thead>\n<tbody>\n'
        )
    )
    timed = Markup(
        '<td class="num">{}</td><td class="num">{} ({})</td><td class="num">{} ({})</td>'
        '<td class="num">{} ({})</td><td class="num">{}</td><td>{}</td>\n'
    )
    for r in ranks:
        if r.get("activities_in_window"):
            cells = timed.format(
                _us(r["span_us"]),
                _us(r["idle_us"]),
                _pct(r["idle_share"]),
                _us(r["compute_us"]),
                _pct(r["compute_share"]),
                _us(r["non_compute_us"]),
                _pct(r["non_compute_share"]),
                _num(r["activities_in_window"]),
                r["window"]["kind"],
            )
        else:
            cells = Markup(
                '<td colspan="6" class="muted">no GPU kernels in this trace: CPU side only</td>'
            )
        out.append(
            Markup("<tr><td>{}</td><td>{}</td>\n{}</tr>\n").format(
                r["rank"], r["device"] or "", cells
            )
        )
    out.append(Markup("</tbody></table>\n"))
    if summary.get("gpu_ranks", 0) > 1:
        overlap = (
            Markup(";\ncommunication overlaps computation {} of its time").format(
                _pct(summary["comm_overlap_share"])
            )
            if summary.get("comm_overlap_share") is not None
            else ""
        )
        out.append(
            Markup(
                "<p>Across {} ranks: slowest rank (most computation) <strong>{}</strong>\n"
                "({} vs {}, spread {}){}.</p>\n"
            ).format(
                summary["gpu_ranks"],
                summary["slowest_rank"],
                _us(summary["slowest_compute_us"]),
                _us(summary["fastest_compute_us"]),
                _pct(summary["compute_spread"]),
                overlap,
            )
        )
    return join(out)


def _rank_detail(r: Any) -> Markup:
    """One GPU rank: idle causes, launch latency, kernel types, top kernels, precision, steps."""
    idle, latency, duration, comm = (
        r["idle_breakdown"],
        r["launch_latency"],
        r["kernel_duration"],
        r["communication"],
    )
    facts = [
        ("idle: waiting on the host", _us(idle["host_wait_us"])),
        ("idle: queued behind other work", _us(idle["kernel_wait_us"])),
        ("idle: no launch record", _us(idle["other_us"])),
    ]
    extra = []
    if latency.get("count"):
        spread = f"median {_us(latency['median_us'])}, p95 {_us(latency['p95_us'])}"
        extra.append(
            (
                "launch latency (CPU launch → GPU start)",
                f"{spread}, {_num(latency['count'])} launches",
            )
        )
    if duration.get("count"):
        short = _pct(r["short_kernel_share"])
        extra.append(
            ("kernel duration", f"median {_us(duration['median_us'])}; {short} under 10 µs")
        )
    if comm["comm_us"]:
        shares = f"{_pct(comm['overlap_share'])} overlapped, {_us(comm['exposed_us'])} exposed"
        extra.append(("communication", f"{_us(comm['comm_us'])}, {shares}"))
    if r["data_share"]:
        extra.append(("data loading (host, share of step)", _pct(r["data_share"])))
    out = [
        Markup("<h3>Rank {}</h3>\n<table><tbody>\n").format(r["rank"]),
        rows("hn", facts, end="\n"),
        rows("hn", extra),
    ]
    cover = r["top_kernels_cover"]
    unlaunched = (
        Markup(", and {} launched before the profiler started").format(_num(cover["unlaunched"]))
        if cover["unlaunched"]
        else ""
    )
    kernels = (
        [
            _kernel(k),
            k["type"],
            Markup("{}{}").format(k["precision"], _TC[bool(k["tensor_core"])]),
            _num(k["calls"]),
            _us(k["total_us"]),
            _us(k["mean_us"]),
            _pct(k["share"]),
        ]
        for k in r["top_kernels"]
    )
    precision = r["precision"]
    shares = precision["by_precision_share"]
    out += [
        Markup("</tbody></table>\n<h4>Kernel types</h4>\n"),
        table(("type", "#time"), "tn", ((k, _us(v)) for k, v in r["kernel_types"].items())),
        Markup(
            "<h4>Top kernels</h4>\n<table><caption>Over every recorded step: all {} GPU activities "
            "of the trace ({} ProfilerSteps{}); the span, idle and compute figures above cover {}."
            "</caption><thead><tr>{}</tr></thead><tbody>\n{}</tbody></table>\n"
            "<h4>Precision of computation kernels (from their names)</h4>\n<table><thead><tr>{}"
            '</tr></thead><tbody>\n<tr>{}<td class="num">{}</td><td class="num">{} of {}</td>'
            "</tr>\n</tbody></table>\n"
        ).format(
            _num(cover["activities"]),
            len(cover["steps"]),
            unlaunched,
            r["window"]["kind"],
            heads("kernel", "type", "precision", "#calls", "#total", "#mean", "#share"),
            rows("tttnnnn", kernels),
            heads(*(f"#{p}" for p in shares), "#tensor cores", "#GEMM/conv in FP32"),
            rows("n" * len(shares), [[_pct(v) for v in shares.values()]])[4:-5],
            _pct(precision["tensor_core_share"]),
            _pct(precision["fp32_matmul_share"]),
            _us(precision["matmul_us"]),
        ),
    ]
    if precision["fp32_matmul_kernels"]:
        item = Markup('<li><code title="{}">{}</code>: {} calls, {}</li>')
        out.append(
            Markup(
                "<p>FP32 GEMMs and convolutions that could run in low precision on tensor cores:"
                "</p>\n<ul>{}</ul>\n"
            ).format(
                join(
                    item.format(k["name"], k["short_name"], _num(k["calls"]), _us(k["total_us"]))
                    for k in precision["fp32_matmul_kernels"]
                )
            )
        )
    if r.get("steps"):
        steps = r["steps"]
        more = Markup(
            '<tr><td colspan="7" class="muted">… and {} more steps (in session.json)</td></tr>'
        ).format(len(steps) - TABLE_STEPS)
        cells = (
            [s["step"], *(_us(s[k]) for k in _STEP_US), _num(s["kernels"])]
            for s in steps[:TABLE_STEPS]
        )
        head = ("step", "#host", "#GPU span", "#idle", "#compute", "#non-compute", "#kernels")
        out.append(
            Markup(
                '<h4>Per step (GPU work each ProfilerStep launched)</h4>\n<p class="muted">{}</p>\n'
            ).format(r["attribution"])
        )
        out.append(table(head, "tnnnnnn", cells, tail=more if len(steps) > TABLE_STEPS else ""))
    return join(out)


_TC = {True: " (tensor cores)", False: ""}


def _kernel(k: Any) -> Markup:
    """A kernel's short name, its full name on hover."""
    return Markup('<code title="{}">{}</code>').format(k["name"], k["short_name"])


_STEP_US = ("host_us", "span_us", "idle_us", "compute_us", "non_compute_us")


def _cpu_side(r: Any) -> Markup:
    """A rank without GPU kernels: its top CPU ops."""
    ops = ((op["name"], _num(op["calls"]), _us(op["inclusive_us"])) for op in r["cpu_top_ops"])
    return Markup("<h3>Rank {}: CPU side</h3>\n{}").format(
        r["rank"], table(("CPU op", "#calls", "#inclusive time"), "cnn", ops)
    )


def _two_definitions(r: Any) -> Markup:
    """Step time and data loading as ampdiag defines them and as the TensorBoard plugin did."""
    if not r.get("plugin_steps"):
        return Markup("")
    plugin = {p["step"]: p for p in r["plugin_steps"]}
    absent = Markup('<span class="muted">not in the plugin\'s view</span>')
    cells = (
        (
            s["step"],
            _us(s["total_us"]),
            _us(plugin[s["step"]]["plugin_step_us"]) if s["step"] in plugin else absent,
            _us(s["data_us"]),
            _us(plugin[s["step"]]["plugin_data_us"]) if s["step"] in plugin else "",
        )
        for s in r["host"]["steps"][:TABLE_STEPS]
    )
    head = ["step", "#step time (ampdiag)", "#step time (TensorBoard plugin)"]
    head += ["#data loading (ampdiag)", "#data loading (plugin)"]
    return Markup(
        "<h4>Rank {}: step time and data loading, two definitions</h4>\n{}"
        '<ul class="muted">{}</ul>\n<p class="muted">The figures above and the header use '
        "ampdiag's: the time the loop spent in the step and waiting for data. The plugin's show "
        "when the GPU work a step launched was done, and how much loading a faster loader could "
        "still win back.</p>\n"
    ).format(
        r["rank"],
        table(head, "tnnnn", cells),
        join(Markup("<li>{}</li>").format(text) for text in r["definitions"].values()),
    )


def _memory(r: Any, figures: list[Markup]) -> Markup:
    """The trace's memory: each device's peak, the curve, the ops that allocate the most."""
    if not r.get("memory"):
        return Markup("")
    memory = r["memory"]
    devices = (_device(d) for d in memory["devices"])
    ops = (
        [
            o["name"],
            _num(o["allocations"]),
            _bytes(o["allocated_bytes"]),
            _bytes(o["held_at_peak_bytes"]),
        ]
        for o in memory["top_ops"]
    )
    figure = Markup('<figure class="figure" aria-label="memory rank {}">{}</figure>')
    head = ("device", "#peak allocated", "when", "op at the peak", "#peak reserved", "#events")
    return Markup(
        "<h4>Rank {0}: memory (the trace's [memory] allocator events)</h4>\n{1}{2}"
        "<table><caption>Ops that allocate the most on {3} (the innermost op running at each "
        "allocation), and what their allocations still hold at the peak</caption>\n<thead><tr>"
        "{4}</tr></thead><tbody>\n{5}</tbody></table>\n"
    ).format(
        r["rank"],
        table(head, "tnttnn", devices),
        join(figure.format(r["rank"], fig) for fig in figures),
        memory["top_ops_device"],
        heads("op", "#allocations", "#allocated", "#held at the peak"),
        rows("cnnn", ops),
    )


def _device(d: Any) -> list[Any]:
    """A device's row of the memory table: its peak, when and in which op, reserved, events."""
    peak = d["peak"]
    step = Markup(", in {}").format(peak["step"]) if peak["step"] else ""
    return [
        d["device"],
        _bytes(peak["bytes"]),
        Markup("{:.1f} ms{}").format(peak["t_ms"], step),
        Markup("<code>{}</code>").format(peak["op"]) if peak["op"] else "",
        "" if d["peak_reserved"] is None else _bytes(d["peak_reserved"]),
        _num(d["events"]),
    ]


def _modules(r: Any) -> Markup:
    """A ``with_modules`` trace's host time per module."""
    if not r.get("modules"):
        return Markup("")
    cells = ((m["module"], _num(m["calls"]), _us(m["inclusive_us"])) for m in r["modules"])
    return Markup("<h4>Rank {}: time per module (host, forward)</h4>\n{}").format(
        r["rank"], table(("module", "#calls", "#inclusive time"), "cnn", cells)
    )


def _hta(hta: Any) -> Markup:
    """HTA's own analyses, when the report ran them (``--hta``)."""
    if not hta:
        return Markup("")
    code = Markup("<code>{}</code><br>")
    failed = Markup('<span class="muted">did not run: {}</span>')
    cells = (
        (name, join(code.format(units.by_key("", row)) for row in res.get("rows", [])[:10]))
        if res.get("ok")
        else (name, failed.format(res.get("error")))
        for name, res in hta.items()
    )
    return Markup("<h3>HTA analyses</h3>\n") + table(("analysis", "result"), "tt", cells)
