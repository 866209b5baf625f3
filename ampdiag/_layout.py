"""Names of the files and folders in an output folder, in one place.

Kept apart (nothing heavy imported) so that readers of a saved session, and ``ampdiag report``
of a trace, import no torch.
"""

from pathlib import Path

from ampdiag.errors import OutputError

SESSION_FILE = "session.json"
REPORT_FILE = "report.html"
TENSORBOARD_DIR = "tensorboard"  # TensorBoard event files
TRACE_DIR = "trace"  # Kineto traces, in the layout the TensorBoard profiler plugin reads
MEMORY_DIR = "memory"  # CUDA memory snapshots


def check_writable(out: Path) -> None:
    """Creates ``out`` and proves it writable, or raises OutputError with one clear line."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".ampdiag-write-test"
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise OutputError(
            f"cannot write the output folder {str(out)!r}: {exc.strerror or exc}"
        ) from None
