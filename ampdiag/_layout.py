"""Names of the files in an output folder, kept apart so that readers import nothing heavy."""

from pathlib import Path

from ampdiag.errors import OutputError

SESSION_FILE = "session.json"


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
