"""TensorBoard event files under out/tensorboard/: scalars per step and the findings as text.

The trace under out/trace/ is already in the profiler plugin's layout, so
``tensorboard --logdir OUT`` shows both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampdiag.render.sections import section_modules
from ampdiag.session import Session

TB_DIR = "tensorboard"


def findings_markdown(session: Session) -> str:
    """The findings as a Markdown table (TensorBoard's text plugin renders Markdown)."""
    if not session.findings:
        return "No findings."
    rows = ["| severity | id | finding |", "|---|---|---|"]
    for f in session.findings:
        title = f.title.replace("|", "\\|")
        rows.append(f"| {f.severity} | {f.id} | {title} |")
    return "\n".join(rows)


def write_tensorboard(session: Session, out: Path) -> Path:
    """Writes the event files and returns the folder."""
    from torch.utils.tensorboard import SummaryWriter

    folder = out / TB_DIR
    writer: Any = SummaryWriter(log_dir=str(folder))
    try:
        for step in session.steps:
            writer.add_scalar("step/wall_time_ms", step["wall_s"] * 1000, step["index"])
            if isinstance(step.get("loss"), (int, float)):
                writer.add_scalar("step/loss", step["loss"], step["index"])
        share = session.section("profiler").get("breakdown", {}).get("share", {})
        for name, value in share.items():
            writer.add_scalar(f"time_share/{name}", value, 0)
        writer.add_text("ampdiag/findings", findings_markdown(session), 0)
        # Each report-section module may add its own scalars/histograms/figures.
        for module in section_modules():
            hook = getattr(module, "write_tensorboard", None)
            if hook is not None:
                hook(session, writer)
    finally:
        writer.close()
    return folder
