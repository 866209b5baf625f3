"""TensorBoard event files under out/tensorboard/<run>/: per-step scalars, the rest as text.

What is written, tag by tag: `TAGS` (docs/guide/reports.md for the user). The run is named
after the output folder, so ``--logdir reports/x/tensorboard`` shows "x" and a diff's runs
stay apart. A figure measured once is a Markdown table row, not a one-point curve, read from
the headline figures (`ampdiag.analysis.figures`) that the HTML report and the console state.
No images: TensorBoard draws the per-step charts from the scalars, and a plotting library
would cost the user's exit its import. The events are TensorBoard's protobufs in TFRecord
framing written here, not by torch's SummaryWriter, so ``ampdiag report --format
tensorboard`` imports no torch.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ampdiag import units as humanize
from ampdiag._layout import TENSORBOARD_DIR
from ampdiag.render import stated
from ampdiag.render.sections import gradscaler
from ampdiag.render.sections.time import categories
from ampdiag.render.templating import merged_fixes
from ampdiag.session import Session

MiB = 1024**2

#: Every tag this module writes (a findings/<id> text and a time/<category>_ms scalar aside),
#: with the description TensorBoard shows beside it.
TAGS: dict[str, str] = {
    "step/wall_time_ms": "Wall time of each step, ms (from one optimizer step to the next).",
    "step/loss": "The step's loss (the sum over its micro-batches).",
    "scaler/loss_scale": "The GradScaler's loss scale at each recorded step.",
    "scaler/skipped": "1 on a step the GradScaler skipped (inf/NaN gradients), else 0.",
    "numerics/grad_norm": "Gradient norm at each sampled step.",
    "numerics/grad_subnormal_fraction": (
        "Share of nonzero parameter-gradient values that are subnormal in FP16, per sampled step."
    ),
    "numerics/grad_flush_fraction": (
        "Share of nonzero parameter-gradient values below FP16's 2^-24 (flushed to zero)."
    ),
    "numerics/grad_zero_fraction": "Share of parameter-gradient values that are zero.",
    "numerics/log2_grad_held": "log2 |gradient| of the parameter gradients as FP16 held them.",
    "numerics/log2_grad_true": "log2 |gradient| of the parameter gradients from the FP32 replay.",
    "numerics/log2_activation_grad": "log2 |gradient| entering the modules (unscaled).",
    "numerics/modules": "Per-module share of the gradient entering it that FP16 loses.",
    "summary/figures": (
        "The run's figures measured once (step time, loss, memory, underflow, speed against "
        "FP32, time shares): the values the HTML report and the console state."
    ),
    "timeline/ranks": "Per-rank GPU idle, compute and non-compute shares of the traced window.",
    "ranks/step_times": "Per-rank wall time per step (median, slowest), ms.",
    "ampdiag/findings": "Every finding of the run: severity, id and title.",
}


def describe(tag: str) -> str:
    """The description TensorBoard shows beside a tag (`TAGS`; the per-category host times)."""
    if tag.startswith("time/") and tag.endswith("_ms"):
        cat = tag.removeprefix("time/").removesuffix("_ms")
        return f"Host time in {cat} per profiled step, ms (the trace's step breakdown)."
    return TAGS.get(tag, "")


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def findings_markdown(session: Session) -> str:
    """The findings as a Markdown table (TensorBoard's text plugin renders Markdown)."""
    if not session.findings:
        return "No findings."
    return _table(
        ("severity", "id", "finding"), [(f.severity, f.id, f.title) for f in session.findings]
    )


def finding_markdown(finding: Any) -> str:
    """One finding as Markdown: title, evidence as a table (humanized), fixes as code blocks.

    The fixes of the findings a recommendation merged follow its own, each under its id.
    """
    parts = [f"**{finding.severity}** `{finding.id}`: {_md(finding.title)}"]
    rows = [
        (humanize.label(str(k), v), humanize.by_key(str(k), v))
        for k, v in finding.evidence.items()
        if k != "merged"
    ]
    if rows:
        parts.append(_table(("evidence", "value"), rows))
    merged = [m for m in finding.evidence.get("merged") or [] if isinstance(m, dict)]
    if merged:
        parts.append(
            "Explains:\n\n"
            + "\n".join(f"- **{m.get('severity')}** `{m.get('id')}`: {_md(str(m.get('title')))}"
                        for m in merged)
        )  # fmt: skip
    if finding.fix:
        parts.append("Fix:\n\n    " + finding.fix.replace("\n", "\n    "))
    for mid, fix in merged_fixes(finding):
        parts.append(f"Also, for `{mid}`:\n\n    " + fix.replace("\n", "\n    "))
    return "\n\n".join(parts)


def _clean(value: Any) -> Any:
    """Text TensorBoard's protobufs can encode: lone surrogates replaced."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8")
    return value


class EventWriter:
    """Scalars, texts and histograms as TensorBoard events, without torch.

    The records are those torch's SummaryWriter writes for the same calls (a text is a string
    tensor of the "text" plugin under ``<tag>/text_summary``), so TensorBoard's dashboards read
    them. A lone surrogate in a tag or text (a module's name can hold one), which protobuf
    cannot encode, becomes "?".
    """

    def __init__(self, folder: Path) -> None:
        from tensorboard.compat.proto import event_pb2

        folder.mkdir(parents=True, exist_ok=True)
        # TensorBoard's writer's file name and first event; the records are framed here
        # (`_record`): importing its writer (``tensorboard.summary``, fsspec, absl) cost the
        # user's exit ~0.1 s, more than writing every event
        self._path = folder / (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        )
        version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._records = [_record(version.SerializeToString())]
        self._described: set[str] = set()

    def _metadata(self, tag: str, plugin: str) -> Any:
        """The tag's description (`TAGS`), on its first event only (as TensorBoard reads it)."""
        from tensorboard.compat.proto import summary_pb2

        data = summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin)
        if tag in self._described:
            return summary_pb2.SummaryMetadata(plugin_data=data)
        self._described.add(tag)
        return summary_pb2.SummaryMetadata(
            plugin_data=data, display_name=tag, summary_description=describe(tag)
        )

    def _add(self, value: Any, step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=[value])
        event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
        self._records.append(_record(event.SerializeToString()))

    def add_scalar(self, tag: str, value: float, step: int = 0) -> None:
        """One point of a scalar curve."""
        from tensorboard.compat.proto import summary_pb2

        value_pb = summary_pb2.Summary.Value(
            tag=_clean(tag), simple_value=float(value), metadata=self._metadata(tag, "scalars")
        )
        self._add(value_pb, step)

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
        value = summary_pb2.Summary.Value(
            tag=_clean(tag) + "/text_summary", metadata=self._metadata(tag, "text"), tensor=tensor
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
        meta = self._metadata(tag, "histograms")
        self._add(summary_pb2.Summary.Value(tag=_clean(tag), histo=histo, metadata=meta), step)

    def close(self) -> None:
        """Writes the event file."""
        self._path.write_bytes(b"".join(self._records))


#: CRC-32C's byte table (the reflected Castagnoli polynomial, one bit per halving).
_CRC32C = [
    functools.reduce(lambda c, _: (c >> 1) ^ (0x82F63B78 & -(c & 1)), range(8), i)
    for i in range(256)
]
#: The last part of an event file's name: two writers in one process and second differ by it.
_FILES = itertools.count()


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated and offset (TensorBoard checks it)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record(data: bytes) -> bytes:
    """One TFRecord: the length, its checksum, the data, its checksum (little-endian)."""
    header = struct.pack("<Q", len(data))
    return b"".join(
        (header, struct.pack("<I", _masked_crc32c(header)), data,
         struct.pack("<I", _masked_crc32c(data)))
    )  # fmt: skip


def _steps(session: Session, writer: EventWriter) -> None:
    for step in session.steps:
        if isinstance(step.get("wall_s"), (int, float)):
            writer.add_scalar("step/wall_time_ms", step["wall_s"] * 1000, step["index"])
        if isinstance(step.get("loss"), (int, float)):
            writer.add_scalar("step/loss", step["loss"], step["index"])  # type: ignore[arg-type]


def summary_rows(session: Session) -> list[tuple[str, str]]:
    """The figures measured once, as (figure, value) rows, formatted as the report formats them.

    Read from the headline figures (`ampdiag.analysis.figures`) and the sections' totals.
    """
    fig = stated.figures(session)
    rows: list[tuple[str, str]] = []
    step = fig.get("step_time")
    if isinstance(step, dict):
        spread = step.get("spread_s")
        text = humanize.micros(step["median_s"] * 1e6)
        if isinstance(spread, (int, float)):
            text += f" ± {humanize.micros(spread * 1e6)}"
        text += f" over {step['steps']} steps"
        if step.get("first_left_out"):
            text += ", the first left out"
        rows.append(("Step time (median)", text))
    if fig.get("final_loss") is not None:
        rows.append(("Final loss", humanize.scalar(fig["final_loss"])))
    if fig.get("memory_peak_bytes") is not None:
        rows.append(("Memory peak", humanize.nbytes(fig["memory_peak_bytes"])))
    if fig.get("underflow_fraction") is not None:
        rows.append(("Gradient underflow (FP16)", humanize.percent(fig["underflow_fraction"])))
    skipped = fig.get("skipped_steps")
    if isinstance(skipped, dict):
        rows.append(
            ("Steps skipped by the GradScaler", f"{skipped['skipped']} of {skipped['steps']}")
        )
    scale = fig.get("loss_scale")
    if isinstance(scale, dict):
        rows.append((
            "Loss scale",
            f"{humanize.scalar(scale['first'])} to {humanize.scalar(scale['last'])} "
            f"(smallest {humanize.scalar(scale['min'])})",
        ))  # fmt: skip
    speed = fig.get("speed_vs_fp32")
    if isinstance(speed, dict):
        rows.append((
            f"Time against FP32 ({speed['source']})",
            f"{speed['time_ratio']:.2f}x ({speed['low']:.2f}-{speed['high']:.2f}x, "
            f"{speed['verdict']}): FP32 {humanize.micros(speed['fp32_ms'] * 1e3)}, "
            f"{speed.get('precision') or 'autocast'} {humanize.micros(speed['run_ms'] * 1e3)}",
        ))  # fmt: skip
    for share, name in (
        (fig.get("low_precision_flops_share"), "FLOPs in low precision"),
        (fig.get("low_precision_time_share"), "Op time in low precision"),
    ):
        if share is not None:
            rows.append((name, humanize.percent(share)))
    share = session.section("profiler").get("breakdown", {}).get("share", {})
    if share:
        rows.append(("Step time by phase", ", ".join(
            f"{k} {humanize.percent(v)}" for k, v in share.items())))  # fmt: skip
    mem = session.section("memory")
    for key in ("parameters", "gradients", "optimizer_state"):
        value = (mem.get("model_state") or {}).get(key)
        if isinstance(value, (int, float)):
            rows.append((f"Model state: {humanize.label(key).lower()}", humanize.nbytes(value)))
    return rows


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _summary(session: Session, writer: EventWriter) -> None:
    rows = summary_rows(session)
    if rows:
        writer.add_text("summary/figures", _table(("figure", "value"), rows), 0)


def _findings(session: Session, writer: EventWriter) -> None:
    writer.add_text("ampdiag/findings", findings_markdown(session), 0)
    seen: dict[str, int] = {}
    for f in session.findings:
        n = seen[f.id] = seen.get(f.id, 0) + 1
        writer.add_text(f"findings/{f.id}", finding_markdown(f), n - 1)


def _time(session: Session, writer: EventWriter) -> None:
    """The profiled steps' host time by category, ms, as scalars (step = the profiled step).

    Only from two profiled steps: one is a figure measured once (the summary's time shares).
    """
    breakdown = session.section("profiler").get("breakdown", {})
    rows = breakdown.get("steps", [])
    for row in rows if len(rows) >= 2 else []:
        for cat in categories(breakdown):
            value = row.get(f"{cat}_us")
            if isinstance(value, (int, float)):
                writer.add_scalar(f"time/{cat}_ms", float(value) / 1000, int(row["step"]))


def _ranks(session: Session, writer: EventWriter) -> None:
    """Each rank's step time (median, slowest), one table row per rank."""
    rows = []
    for r in session.section("ranks").get("rows", []):
        times = [float(t) for t in r.get("step_times_ms") or [] if isinstance(t, (int, float))]
        if times:
            times.sort()
            rows.append((str(r["rank"]), f"{times[len(times) // 2]:.4g}", f"{times[-1]:.4g}"))
    if rows:
        writer.add_text("ranks/step_times", _table(("rank", "median ms", "slowest ms"), rows), 0)


def _timeline(session: Session, writer: EventWriter) -> None:
    """Per-rank idle / compute / non-compute shares, one table row per rank."""
    kinds = ("idle", "compute", "non_compute")
    rows = [
        (str(r["rank"]), *(humanize.percent(r.get(f"{k}_share")) for k in kinds))
        for r in session.section("timeline").get("ranks", [])
        if isinstance(r, dict) and r.get("activities_in_window")
    ]
    if rows:
        writer.add_text("timeline/ranks", _table(("rank", "idle", "compute", "non-compute"), rows))


def _numerics(session: Session, writer: EventWriter) -> None:
    """Per sampled step: gradient norm and underflow; log2|g| histograms; per-module table."""
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
    modules = [
        m for m in session.section("activations").get("modules", []) if "subnormal_fraction" in m
    ]
    modules.sort(key=lambda m: -float(m.get("lost_fraction", m["subnormal_fraction"])))
    if modules:
        pct = humanize.percent
        rows = [
            (str(m["module"]), pct(m.get("lost_fraction")), pct(m["subnormal_fraction"]))
            for m in modules
        ]
        writer.add_text(
            "numerics/modules", _table(("module", "lost against FP32", "subnormal in FP16"), rows)
        )


def _gradscaler(session: Session, writer: EventWriter) -> None:
    """Loss scale and skipped steps per step, when the run recorded them."""
    for r in gradscaler.scale_history(session):
        writer.add_scalar("scaler/loss_scale", float(r["scale"]), r["step"])
        writer.add_scalar("scaler/skipped", 1.0 if r.get("skipped") else 0.0, r["step"])


#: What goes to TensorBoard, in order: one function per part of the session.
SECTION_WRITERS: tuple[Callable[[Session, EventWriter], None], ...] = (
    _steps,
    _summary,
    _findings,
    _ranks,
    _time,
    _timeline,
    _numerics,
    _gradscaler,
)


def run_name(out: Path) -> str:
    """The TensorBoard run of a session written to ``out``: the output folder's name."""
    return Path(out).resolve().name or "run"


def write_tensorboard(session: Session, out: Path, run: str | None = None) -> Path:
    """Writes the event files into ``out/tensorboard/<run>/`` and returns that folder.

    ``run`` names the run (default: the output folder's name, `run_name`), so that several
    sessions (a before/after diff, every run under ``reports/``) show as separate runs.
    """
    root = out / TENSORBOARD_DIR
    folder = root / (run or run_name(out))
    # One session, one event file: an earlier render of this folder would show every point
    # twice in TensorBoard, so ampdiag's own previous event files go first (those of the
    # older layout, directly in tensorboard/, too).
    for place in (folder, root):
        for old in place.glob("events.out.tfevents.*") if place.is_dir() else []:
            old.unlink()
    writer = EventWriter(folder)
    try:
        for write in SECTION_WRITERS:
            write(session, writer)
    finally:
        writer.close()
    return folder
