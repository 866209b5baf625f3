"""``ampdiag run script.py [args...]``: an unmodified training script under ``diagnose()``.

Like ``python script.py`` (and ``pyinstrument script.py``): the script runs as ``__main__``
(``runpy.run_path``), with ``sys.argv`` set to ``[script, *args]`` and the script's folder
first on ``sys.path``; both are put back afterwards. The whole script is the ``diagnose()``
block, so model, optimizer and GradScaler are found by themselves, and what the context
manager does on an error or Ctrl-C it does here: the session and report of what was
collected are written (``status: "error"`` / ``"interrupted"``) and the exception goes on.
``sys.exit(0)`` (or ``sys.exit()``) is a normal end; any other exit code is an error end.
"""

from __future__ import annotations

import runpy
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ampdiag.sources.live.diagnosis import Diagnosis, diagnose
from ampdiag.sources.live.windowed import WindowedDiagnosis

#: The script errors `run(print_error=True)` printed (so that its caller does not print twice).
printed: list[BaseException] = []


def exit_code(exc: SystemExit) -> int:
    """The process exit code Python gives a SystemExit (``sys.exit("msg")`` is 1)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def run(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    out: str | Path | None = None,
    print_error: bool = False,
    **settings: Any,
) -> Diagnosis | WindowedDiagnosis:
    """Runs ``script`` as ``__main__`` inside ``diagnose(out=out, **settings)``.

    Args:
        script: The Python file to run.
        args: Its command-line arguments (``sys.argv[1:]`` inside the script).
        out: The output folder (default: a new ``reports/run-<time>/``).
        print_error: Print the script's own error (its traceback without ampdiag's and
            runpy's frames, as ``python script.py`` shows it) to stderr as it leaves the
            script, before the block's exit prints its summary (``ampdiag run`` does).
        **settings: Any field of `DiagnoseConfig`.

    Returns:
        The handle `diagnose()` yielded, when the script ended normally (or with ``sys.exit(0)``).

    Raises:
        FileNotFoundError: ``script`` is not a file (nothing was run).
        BaseException: Whatever the script raised (``SystemExit`` with a non-zero code,
            ``KeyboardInterrupt``, its own errors), unchanged, after the session was written.
    """
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(f"no such script: {str(path)!r}")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        with diagnose(out=out, **settings) as d:
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exc:
                if exit_code(exc) != 0:
                    raise
            except (Exception, KeyboardInterrupt) as exc:  # Ctrl-C: where it stopped, too
                if print_error:
                    print_user_traceback(exc, path)
                    printed.append(exc)
                raise
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return d


def print_user_traceback(exc: BaseException, script: Path) -> None:
    """Prints ``exc`` as Python would for ``python script.py``: no ampdiag or runpy frames.

    The frames before the script's own first one (ampdiag's runner, runpy) are dropped, and so
    are ampdiag's hook frames between the user's (its module and optimizer hooks sit in the
    user's call stack).
    """
    ours = str(Path(__file__).resolve().parents[2])  # the ampdiag package
    target = str(script.resolve())
    te = traceback.TracebackException.from_exception(exc)
    frames = list(te.stack)
    first = next((i for i, f in enumerate(frames) if _resolved(f.filename) == target), 0)
    kept = [f for f in frames[first:] if not _resolved(f.filename).startswith(ours)]
    te.stack = traceback.StackSummary.from_list(kept)
    sys.stderr.write("".join(te.format()))
    sys.stderr.flush()


def _resolved(filename: str) -> str:
    try:
        return str(Path(filename).resolve())
    except (OSError, ValueError):
        return filename
