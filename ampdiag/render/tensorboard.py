"""TensorBoard event files under out/tensorboard/: scalars, the findings as text, the figures.

Written here: step wall time and loss per step, the host time shares, the summary numbers of
the findings that carry them (underflow fraction, skipped steps, loss scale, memory peak), the
findings as a Markdown table and one text entry per finding (tags ``ampdiag/findings`` and
``findings/<id>``; torch's SummaryWriter stores text tag T as ``T/text_summary``). Each
report-section module adds its own scalars, histograms and figures through its
``write_tensorboard(session, writer)``.

The profiler trace under out/trace/ is already in the layout of TensorBoard's profiler plugin
(``torch-tb-profiler``: ``<run>/<worker>.<time>.pt.trace.json.gz``), so ``tensorboard --logdir
OUT`` lists the run "tensorboard" (these event files) and, with the plugin installed, the run
"trace" in its PyTorch Profiler tab.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ampdiag import units as humanize
from ampdiag._layout import TENSORBOARD_DIR
from ampdiag.render import png
from ampdiag.render.charts import Chart
from ampdiag.render.sections import section_modules
from ampdiag.render.templating import merged_fixes
from ampdiag.session import Session

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


class _CleanWriter:
    """A SummaryWriter whose tags and texts may hold any characters (a module's name can)."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._writer, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return method(*map(_clean, args), **{k: _clean(v) for k, v in kwargs.items()})

        return call


def add_chart(writer: Any, tag: str, chart: Chart, step: int = 0) -> None:
    """Draws a chart as PNG and adds it to TensorBoard's image dashboard."""
    import matplotlib.image as mpimg

    image = mpimg.imread(io.BytesIO(png.draw(chart)), format="png")
    if image.ndim == 2:
        image = image[:, :, None]
    writer.add_image(tag, image[:, :, :3], step, dataformats="HWC")


def write_tensorboard(session: Session, out: Path, run: str | None = None) -> Path:
    """Writes the event files into ``out/tensorboard/`` (or ``out/tensorboard/<run>/``).

    ``run`` names the run, so that several sessions (a before/after diff) show as separate
    runs in one TensorBoard logdir.
    """
    from torch.utils.tensorboard import SummaryWriter

    folder = out / TENSORBOARD_DIR if run is None else out / TENSORBOARD_DIR / run
    # One session, one event file: an earlier render of this folder would show every point
    # twice in TensorBoard, so ampdiag's own previous event files go first.
    for old in folder.glob("events.out.tfevents.*") if folder.is_dir() else []:
        old.unlink()
    writer: Any = _CleanWriter(SummaryWriter(log_dir=str(folder)))
    try:
        for step in session.steps:
            if isinstance(step.get("wall_s"), (int, float)):
                writer.add_scalar("step/wall_time_ms", step["wall_s"] * 1000, step["index"])
            if isinstance(step.get("loss"), (int, float)):
                writer.add_scalar("step/loss", step["loss"], step["index"])
        share = session.section("profiler").get("breakdown", {}).get("share", {})
        for name, value in share.items():
            writer.add_scalar(f"time_share/{name}", value, 0)
        for tag, value in _evidence_numbers(session).items():
            writer.add_scalar(tag, value, 0)
        writer.add_text("ampdiag/findings", findings_markdown(session), 0)
        seen: dict[str, int] = {}
        for f in session.findings:
            n = seen[f.id] = seen.get(f.id, 0) + 1
            writer.add_text(f"findings/{f.id}", finding_markdown(f), n - 1)
        # Each report-section module may add its own scalars/histograms/figures.
        for module in section_modules():
            hook = getattr(module, "write_tensorboard", None)
            if hook is not None:
                hook(session, writer)
    finally:
        writer.close()
    return folder
