"""Memory: the timeline by category, the breakdown at the peak, CUDA allocator facts, what-ifs.

The what-if estimates are the derive step's (``derived.memory``); this module only formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from ampdiag import units as humanize
from ampdiag.render import charts, svg, templating
from ampdiag.render.sections import ReportSection, section
from ampdiag.render.templating import join, table
from ampdiag.session import Session

TITLE = "Memory"
NEEDS = "the memory collector (allocator events or a CUDA snapshot)"

MiB = 1024**2


def figures(mem: Mapping[str, Any]) -> dict[str, charts.Chart]:
    """The memory section's charts (the timeline by category is also `ampdiag.plot`'s)."""
    figures: dict[str, charts.Chart] = {}
    tl = mem.get("timeline") or {}
    series = {
        str(c): [v / MiB for v in values]
        for c, values in (tl.get("bytes") or {}).items()
        if any(values)
    }
    if tl.get("t_ms") and series:
        figures["memory-timeline"] = charts.line(
            tl["t_ms"], series, "ms (profiled steps)", "MiB", "Memory by category", kind="area"
        )
    by_cat = (mem.get("peak") or {}).get("by_category") or {}
    nonzero = [(c, v) for c, v in by_cat.items() if v]
    if nonzero:
        nonzero.sort(key=lambda cv: -cv[1])
        figures["memory-peak"] = charts.bars(
            [c for c, _ in nonzero],
            {"MiB": [v / MiB for _, v in nonzero]},
            "MiB",
            "At the peak",
            horizontal=True,
        )
    cuda = mem.get("cuda") or {}
    cuda_tl = cuda.get("timeline") or {}
    if len(cuda_tl.get("event", [])) >= 2:
        peak_at = (cuda.get("peak") or {}).get("event_index")
        figures["cuda-allocator"] = charts.line(
            cuda_tl["event"],
            {
                "allocated MiB": [v / MiB for v in cuda_tl["allocated"]],
                "reserved MiB": [v / MiB for v in cuda_tl["reserved"]],
            },
            "allocator event",
            "MiB",
            "CUDA allocator: allocated vs reserved (the peak marked)",
            # the timeline's points are "after event i - 1": the peak is point index + 1
            marks=[int(peak_at) + 1] if isinstance(peak_at, int) else (),
        )
    return figures


@section(TITLE, NEEDS)
def build(session: Session) -> ReportSection | None:
    """The memory section, when the session has a memory section."""
    mem = session.section("memory")
    if not mem:
        return None
    uris = {name: svg.inline(chart) for name, chart in figures(mem).items()}
    what = session.section("derived").get("memory") or {}
    html = join(
        (
            _peak(mem, what),
            templating.figures(uris),
            _by_category(mem),
            _model_state(mem.get("model_state") or {}),
            _what_if(mem, what),
            _cuda(mem.get("cuda") or {}),
        )
    )
    peak = (mem.get("peak") or {}).get("bytes")
    summary = f"peak {humanize.nbytes(peak)}" if peak else ""
    ms = what.get("model_state_bytes")
    if ms:
        summary += (", " if summary else "") + f"model state {humanize.nbytes(ms)}"
    return ReportSection(id="memory", title=TITLE, html=html, summary=summary, figures=list(uris))


def _peak(mem: Any, what: Any) -> Markup:
    """The peak, when and where, against the capacity."""
    pk = mem.get("peak") or {}
    if not pk.get("bytes"):
        return Markup("")
    step = Markup(" in <code>{}</code>").format(pk["step"]) if pk.get("step") else ""
    batch = (
        Markup(" at batch {}").format(mem["observed_batch"]) if mem.get("observed_batch") else ""
    )
    capacity = humanize.nbytes(what["capacity_bytes"]) if what.get("capacity_bytes") else "unknown"
    source = Markup(" ({})").format(what["capacity_source"]) if what.get("capacity_source") else ""
    return Markup("<p>Peak: <strong>{}</strong>{}{}. Capacity: {}{}.</p>\n").format(
        humanize.nbytes(pk["bytes"]), step, batch, capacity, source
    )


def _by_category(mem: Any) -> Markup:
    """What the memory held at the peak, by category."""
    pk = mem.get("peak") or {}
    if not pk.get("by_category"):
        return Markup("")
    cells = (
        (
            cat,
            humanize.nbytes(value),
            humanize.percent(value / pk["bytes"]) if pk.get("bytes") else "",
        )
        for cat, value in pk["by_category"].items()
        if value
    )
    source = (
        Markup('<p class="muted">Categories from {} over the profiled steps.</p>').format(
            mem["timeline"]["source"]
        )
        if mem.get("timeline")
        else ""
    )
    top, held = max(pk["by_category"].items(), key=lambda kv: kv[1])
    share = Markup(" ({})").format(humanize.percent(held / pk["bytes"])) if pk.get("bytes") else ""
    head = ("category", "#bytes", "#share")
    # Folded: the chart beside it draws the same numbers; the summary says the one that matters.
    return Markup(
        "<details><summary><strong>At the peak</strong>: {} held the most, {}{}</summary>\n"
        "{}</details>\n{}"
    ).format(top, humanize.nbytes(held), share, table(head, "tnn", cells, True), source)


def _model_state(ms: Any) -> Markup:
    """Parameters, gradients and optimizer state, as live tensors."""
    if not ms:
        return Markup("")
    frozen = (
        Markup(" updated, {} frozen (held, never updated)").format(
            humanize.count(ms["frozen_parameter_count"])
        )
        if ms.get("frozen_parameter_count")
        else ""
    )
    by_key = join(
        Markup(" · {} {}").format(k, humanize.nbytes(v))
        for k, v in (ms.get("optimizer_state_by_key") or {}).items()
    )
    return Markup(
        "<h3>Model state (live tensors)</h3>\n<table>\n<tbody>\n"
        '<tr><td>parameters ({} values{})</td><td class="num">{}</td></tr>\n'
        '<tr><td>gradients</td><td class="num">{}</td></tr>\n'
        '<tr><td>optimizer state{}</td><td class="num">{}</td></tr>\n</tbody></table>\n'
    ).format(
        humanize.count(ms.get("parameter_count", 0)),
        frozen,
        humanize.nbytes(ms.get("parameters", 0)),
        humanize.nbytes(ms.get("gradients", 0)),
        by_key,
        humanize.nbytes(ms.get("optimizer_state", 0)),
    )


def _what_if(mem: Any, what: Any) -> Markup:
    """The derive step's what-if estimates, and how to measure what they lack."""
    if not what.get("rows"):
        return Markup("")
    cells = ((r["scenario"], humanize.nbytes(r["bytes"]), r["basis"]) for r in what["rows"])
    note = ""
    if not what.get("activation_fit") and not mem.get("snapshot_file"):
        note = Markup(
            '<p class="muted">Per-sample activation memory was not measured (one batch size '
            "only). Measure it at two batch sizes: <code>ampdiag.memory_probe(model, make_batch, "
            "loss_fn=..., autocast_dtype=torch.bfloat16)</code> inside the <code>diagnose()</code> "
            "block, before the first step.</p>"
        )
    head = ("scenario", "#bytes", "basis")
    return Markup("<h3>What if</h3>\n{}{}").format(table(head, "tnt", cells, True), note)


def _cuda(cuda: Any) -> Markup:
    """The CUDA allocator's counters, the fragmentation and sites at its peak, OOMs."""
    if not cuda:
        return Markup("")
    b = humanize.nbytes
    st = cuda.get("stats") or {}
    cp = cuda.get("peak") or {}
    out = [Markup("<h3>CUDA allocator</h3>\n<table>\n<tbody>\n")]
    if st:
        out.append(
            Markup(
                '<tr><td>allocated now / peak</td><td class="num">{} / {}</td></tr>\n'
                '<tr><td>reserved now / peak</td><td class="num">{} / {}</td></tr>\n'
                '<tr><td>alloc retries · OOMs</td><td class="num">{} · {}</td></tr>'
            ).format(
                b(st["allocated_bytes"]),
                b(st["allocated_peak_bytes"]),
                b(st["reserved_bytes"]),
                b(st["reserved_peak_bytes"]),
                humanize.count(st["num_alloc_retries"]),
                humanize.count(st["num_ooms"]),
            )
        )
    if cp:
        out.append(
            Markup(
                "<tr><td>fragmentation at the recorded peak (reserved − allocated)</td>"
                '<td class="num">{}</td></tr>'
            ).format(b(cp["fragmentation_bytes"]))
        )
    out.append(Markup("</tbody></table>\n"))
    if cp.get("top_sites"):
        site, op = Markup("<code>{}</code>{}"), Markup(" · <code>{}</code>")
        cells = (
            (
                b(s["bytes"]),
                humanize.count(s["count"]),
                site.format(s["site"] or s["frames"][0], op.format(s["op"]) if s.get("op") else ""),
                join(Markup("<code>{}</code><br>").format(f) for f in s["frames"][1:]),
            )
            for s in cp["top_sites"]
        )
        head = (
            "#bytes",
            "#blocks",
            "first frame in user code · op",
            "user stack (innermost first)",
        )
        out.append(Markup("<h3>Top allocation sites at the peak</h3>\n"))
        out.append(table(head, "nntt", cells, True))
    for o in cuda.get("ooms") or []:
        held = Markup(", ").join(
            Markup("{} {}").format(k, b(v)) for k, v in o["by_category"].items()
        )
        out.append(
            Markup(
                "<p><strong>OOM</strong>: requested {} with {} free on the device; {} allocated, "
                "held by {}.</p>\n"
            ).format(
                b(o["requested_bytes"]), b(o["device_free_bytes"]), b(o["allocated_bytes"]), held
            )
        )
    if cuda.get("snapshot_file"):
        out.append(
            Markup(
                "<p>Snapshot: <code>{0}</code> (open it in PyTorch's memory viewer, "
                "https://pytorch.org/memory_viz, or <code>ampdiag report {0}</code>).</p>"
            ).format(cuda["snapshot_file"])
        )
    return join(out)
