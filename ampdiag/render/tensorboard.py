"""TensorBoard event files under out/tensorboard/: scalars, the findings as text, the figures.

Written here: step wall time and loss per step, the host time shares, the summary numbers of
the findings that carry them (underflow fraction, skipped steps, loss scale, memory peak), the
findings as a Markdown table and one text entry per finding (tags ``ampdiag/findings`` and
``findings/<id>``, stored as ``T/text_summary`` as torch's SummaryWriter does), and each
section's scalars, histograms and figures (the functions in `SECTION_WRITERS`): TensorBoard
output is this module's alone, the section modules draw HTML only.

The events are written with TensorBoard's own writer and protobufs
(``tensorboard.summary.writer``, ``tensorboard.compat.proto``), not torch's SummaryWriter, so
``ampdiag report --format tensorboard`` imports no torch; a figure goes in as the PNG
`ampdiag.render.png` draws, with no decoding.

The profiler trace under out/trace/ is already in the layout of TensorBoard's profiler plugin
(``torch-tb-profiler``: ``<run>/<worker>.<time>.pt.trace.json.gz``), so ``tensorboard --logdir
OUT`` lists the run "tensorboard" (these event files) and, with the plugin installed, the run
"trace" in its PyTorch Profiler tab.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ampdiag import units as humanize
from ampdiag._layout import TENSORBOARD_DIR
from ampdiag.render import png
from ampdiag.render.charts import Chart
from ampdiag.render.sections import gradscaler, ranks
from ampdiag.render.sections import time as time_section
from ampdiag.render.templating import merged_fixes
from ampdiag.session import Session

MiB = 1024**2

#: (finding id, evidence key) -> scalar tag, written once (step 0) when the evidence exists.
SUMMARY_SCALARS: dict[tuple[str, str], str] = {
    ("fp16-grad-underflow", "underflow_fraction"): "summary/underflow_fraction",
    ("fp16-grad-underflow", "recommended_init_scale"): "summary/recommended_init_scale",
    ("skipped-steps", "skipped"): "summary/skipped_steps",
    ("loss-scale-collapse", "scale_min"): "summary/loss_scale_min",
    ("memory-near-capacity", "peak_bytes"): "summary/memory_peak_bytes",
    ("gpu-idle", "idle_share"): "summary/gpu_idle_share",
    ("dataloader-bound", "data_share"): "summary/data_share",
    ("autocast-slower", "slowdown"): "summary/autocast_slowdown",
}


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def findings_markdown(session: Session) -> str:
    """The findings as a Markdown table (TensorBoard's text plugin renders Markdown)."""
    if not session.findings:
        return "No findings."
    rows = ["| severity | id | finding |", "|---|---|---|"]
    for f in session.findings:
        rows.append(f"| {f.severity} | {f.id} | {_md(f.title)} |")
    return "\n".join(rows)


def finding_markdown(finding: Any) -> str:
    """One finding as Markdown: title, evidence as a table (humanized), fixes as code blocks.

    The fixes of the findings a recommendation merged follow its own, each under its id.
    """
    parts = [f"**{finding.severity}** `{finding.id}`: {_md(finding.title)}"]
    rows = [
        f"| {_md(humanize.label(str(k)))} | {_md(humanize.by_key(str(k), v))} |"
        for k, v in finding.evidence.items()
        if k != "merged"
    ]
    if rows:
        parts.append("\n".join(["| evidence | value |", "|---|---|", *rows]))
    if finding.fix:
        parts.append("Fix:\n\n    " + finding.fix.replace("\n", "\n    "))
    for mid, fix in merged_fixes(finding):
        parts.append(f"Also, for `{mid}`:\n\n    " + fix.replace("\n", "\n    "))
    return "\n\n".join(parts)


def _evidence_numbers(session: Session) -> dict[str, float]:
    out: dict[str, float] = {}

    def take(fid: str, evidence: dict[str, Any]) -> None:
        for (want, key), tag in SUMMARY_SCALARS.items():
            value = evidence.get(key)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if want == fid and tag not in out and number:
                out[tag] = float(value)  # type: ignore[arg-type]

    for f in session.findings:
        take(f.id, f.evidence)
        for m in f.evidence.get("merged", []) if isinstance(f.evidence, dict) else []:
            if isinstance(m, dict) and isinstance(m.get("evidence"), dict):
                take(str(m.get("id")), m["evidence"])
    return out


def _clean(value: Any) -> Any:
    """Text TensorBoard's protobufs can encode: lone surrogates replaced."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8")
    return value


class EventWriter:
    """Scalars, texts, histograms and PNG images as TensorBoard events, without torch.

    The records are those torch's SummaryWriter writes for the same calls (a text is a string
    tensor of the "text" plugin under ``<tag>/text_summary``), so TensorBoard's dashboards and
    earlier readers see the same tags. Tags and texts may hold any characters (a module's name
    can): a lone surrogate, which protobuf cannot encode, becomes "?".
    """

    def __init__(self, folder: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._file = EventFileWriter(str(folder))

    def _add(self, value: Any, step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=[value])
        self._file.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def add_scalar(self, tag: str, value: float, step: int = 0) -> None:
        """One point of a scalar curve."""
        from tensorboard.compat.proto import summary_pb2

        self._add(summary_pb2.Summary.Value(tag=_clean(tag), simple_value=float(value)), step)

    def add_text(self, tag: str, text: str, step: int = 0) -> None:
        """Markdown for the text dashboard."""
        from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2

        tensor = tensor_pb2.TensorProto(
            dtype="DT_STRING",
            string_val=[_clean(text).encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]
            ),
        )
        plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        value = summary_pb2.Summary.Value(
            tag=_clean(tag) + "/text_summary",
            metadata=summary_pb2.SummaryMetadata(plugin_data=plugin),
            tensor=tensor,
        )
        self._add(value, step)

    def add_histogram(self, tag: str, counts: dict[int, int], step: int = 0) -> None:
        """A histogram of integer bins: ``counts[x]`` values in ``[x, x + 1)``."""
        from tensorboard.compat.proto import summary_pb2

        xs = sorted(counts)
        histo = summary_pb2.HistogramProto(
            min=float(xs[0]),
            max=float(xs[-1] + 1),
            num=float(sum(counts.values())),
            sum=float(sum(x * counts[x] for x in xs)),
            sum_squares=float(sum(x * x * counts[x] for x in xs)),
            bucket_limit=[float(x + 1) for x in xs],
            bucket=[float(counts[x]) for x in xs],
        )
        self._add(summary_pb2.Summary.Value(tag=_clean(tag), histo=histo), step)

    def add_png(self, tag: str, data: bytes, step: int = 0) -> None:
        """A PNG as it is (its size and colour type read from its IHDR header)."""
        from tensorboard.compat.proto import summary_pb2

        width, height = struct.unpack(">II", data[16:24])
        channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(data[25], 4)
        image = summary_pb2.Summary.Image(
            height=height, width=width, colorspace=channels, encoded_image_string=data
        )
        self._add(summary_pb2.Summary.Value(tag=_clean(tag), image=image), step)

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._file.close()


def add_chart(writer: EventWriter, tag: str, chart: Chart, step: int = 0) -> None:
    """Draws a chart as PNG and adds it to TensorBoard's image dashboard."""
    writer.add_png(tag, png.draw(chart), step)


def _steps(session: Session, writer: EventWriter) -> None:
    for step in session.steps:
        if isinstance(step.get("wall_s"), (int, float)):
            writer.add_scalar("step/wall_time_ms", step["wall_s"] * 1000, step["index"])
        if isinstance(step.get("loss"), (int, float)):
            writer.add_scalar("step/loss", step["loss"], step["index"])  # type: ignore[arg-type]
    share = session.section("profiler").get("breakdown", {}).get("share", {})
    for name, value in share.items():
        writer.add_scalar(f"time_share/{name}", value, 0)
    for tag, value in _evidence_numbers(session).items():
        writer.add_scalar(tag, value, 0)


def _findings(session: Session, writer: EventWriter) -> None:
    writer.add_text("ampdiag/findings", findings_markdown(session), 0)
    seen: dict[str, int] = {}
    for f in session.findings:
        n = seen[f.id] = seen.get(f.id, 0) + 1
        writer.add_text(f"findings/{f.id}", finding_markdown(f), n - 1)


def _time(session: Session, writer: EventWriter) -> None:
    """The speed probe's two times and the time section's figures."""
    probe = session.section("speed_probe")
    for key in ("fp32_ms", "autocast_ms"):
        if isinstance(probe.get(key), (int, float)):
            writer.add_scalar(f"speed_probe/{key}", float(probe[key]), 0)
    for name, chart in time_section.figures(session).items():
        add_chart(writer, f"figures/time/{name}", chart)


def _ranks(session: Session, writer: EventWriter) -> None:
    """The per-rank step-time chart."""
    for name, chart in ranks.figures(session).items():
        add_chart(writer, f"figures/ranks/{name}", chart)


def _timeline(session: Session, writer: EventWriter) -> None:
    """Per-rank idle / compute / non-compute shares as scalars (step = rank)."""
    for r in session.section("timeline").get("ranks", []):
        if isinstance(r, dict) and r.get("activities_in_window"):
            for key in ("idle", "compute", "non_compute"):
                writer.add_scalar(f"timeline/{key}_share", r[f"{key}_share"], int(r["rank"]))


def _precision(session: Session, writer: EventWriter) -> None:
    """Scalars: FP32 share of FLOPs and time, cast count and bytes of the audited step."""
    sec = session.section("precision")
    s = session.section("derived").get("precision")
    if not sec.get("audited") or not isinstance(s, dict):
        return
    step = int(sec.get("step") or 0)
    writer.add_scalar("precision/fp32_flops_share", s["fp32_flops_share"], step)
    writer.add_scalar("precision/fp32_time_share", s["fp32_time_share"], step)
    writer.add_scalar("precision/casts", s["casts"]["total"]["count"], step)
    writer.add_scalar("precision/cast_bytes", s["casts"]["total"]["bytes"], step)


def _numerics(session: Session, writer: EventWriter) -> None:
    """Scalars (loss scale, skips, gradient norm and underflow) and log2|g| histograms."""
    for h in session.section("scaler").get("history") or []:
        writer.add_scalar("numerics/loss_scale", h["scale"], h["step"])
        writer.add_scalar("numerics/skipped", 1.0 if h["skipped"] else 0.0, h["step"])
    grads = session.section("gradients")
    for rec in grads.get("steps", []):
        nz = rec["n"] - rec["zero"] - rec["nonfinite"]
        if isinstance(rec.get("norm"), (int, float)):
            writer.add_scalar("numerics/grad_norm", rec["norm"], rec["step"])
        if nz > 0:
            writer.add_scalar(
                "numerics/grad_subnormal_fraction", rec["subnormal"] / nz, rec["step"]
            )
            writer.add_scalar("numerics/grad_flush_fraction", rec["flush"] / nz, rec["step"])
        writer.add_scalar(
            "numerics/grad_zero_fraction", rec["zero"] / max(1, rec["n"]), rec["step"]
        )
    for tag, hist in (
        ("numerics/log2_grad_held", grads.get("hist_held")),
        ("numerics/log2_grad_true", grads.get("hist_true")),
        ("numerics/log2_activation_grad", session.section("activations").get("exponents")),
    ):
        if hist:
            writer.add_histogram(tag, {int(k): int(v) for k, v in hist.items()}, 0)
    for m in session.section("activations").get("modules", []):
        if "subnormal_fraction" in m:
            writer.add_scalar(
                f"numerics/activation_grad_subnormal/{m['module']}", m["subnormal_fraction"], 0
            )


def _memory(session: Session, writer: EventWriter) -> None:
    """The peak split by category and the model state as scalars."""
    mem = session.section("memory")
    for cat, value in ((mem.get("peak") or {}).get("by_category") or {}).items():
        writer.add_scalar(f"memory/peak_{cat}_MiB", value / MiB, 0)
    for key in ("parameters", "gradients", "optimizer_state"):
        value = (mem.get("model_state") or {}).get(key)
        if isinstance(value, (int, float)):
            writer.add_scalar(f"memory/model_state_{key}_MiB", value / MiB, 0)


def _gradscaler(session: Session, writer: EventWriter) -> None:
    """Loss scale and skipped steps per step, when the run recorded them."""
    for r in gradscaler.scale_history(session):
        writer.add_scalar("scaler/loss_scale", float(r["scale"]), r["step"])
        writer.add_scalar("scaler/skipped", 1.0 if r.get("skipped") else 0.0, r["step"])


#: What goes to TensorBoard, in order: one function per part of the session.
SECTION_WRITERS: tuple[Callable[[Session, EventWriter], None], ...] = (
    _steps,
    _findings,
    _ranks,
    _time,
    _timeline,
    _precision,
    _numerics,
    _gradscaler,
    _memory,
)


def write_tensorboard(session: Session, out: Path, run: str | None = None) -> Path:
    """Writes the event files into ``out/tensorboard/`` (or ``out/tensorboard/<run>/``).

    ``run`` names the run, so that several sessions (a before/after diff) show as separate
    runs in one TensorBoard logdir.
    """
    folder = out / TENSORBOARD_DIR if run is None else out / TENSORBOARD_DIR / run
    # One session, one event file: an earlier render of this folder would show every point
    # twice in TensorBoard, so ampdiag's own previous event files go first.
    for old in folder.glob("events.out.tfevents.*") if folder.is_dir() else []:
        old.unlink()
    writer = EventWriter(folder)
    try:
        for write in SECTION_WRITERS:
            write(session, writer)
    finally:
        writer.close()
    return folder
