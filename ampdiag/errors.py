"""Errors that ampdiag reports to a user as one line (exit code 2), never as a traceback."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input from the user: a missing path, an unreadable or foreign file, a bad option.

    The CLI prints ``ampdiag: <message>`` on stderr and exits with code 2.
    """


class OutputError(InputError):
    """The output folder cannot be created or written."""


def check_writable(out: Path) -> None:
    """Creates ``out`` and proves it writable, or raises OutputError with one clear line.

    Here, not with diagnose(): ``ampdiag report`` checks its output folder too, and must not
    import torch to do it.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".ampdiag-write-test"
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise OutputError(
            f"cannot write the output folder {str(out)!r}: {exc.strerror or exc}"
        ) from None
