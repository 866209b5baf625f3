"""The ``ampdiag`` command: ``demo``, ``run SCRIPT``, ``report PATH``, ``diff A B``, ``--version``.

Exit codes: 0 success; 1 internal error; 2 bad input (one line on stderr, no traceback);
3 a finding at or above ``--fail-on`` exists. ``run`` exits with the script's own code (1
with its traceback on stderr when it raised, 130 on Ctrl-C), as ``python SCRIPT`` would.
"""

from __future__ import annotations

import argparse
import os
import sys
from argparse import SUPPRESS
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from ampdiag._layout import REPORT_FILE
from ampdiag._version import __version__
from ampdiag.errors import InputError
from ampdiag.render.registry import RENDERERS

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_GATE = 0, 1, 2, 3
REPORT_COMMANDS = frozenset({"report", "diff"})
"""Commands that read files and write a report: no user code, no linear algebra, and nothing
left open once their output is written."""
GATES = ("high", "medium", "low")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own exit code is 2 too, but it prints usage; one line is the contract.
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the docs and tests)."""
    parser = _Parser(prog="ampdiag", description="Diagnose PyTorch mixed-precision training.")
    parser.add_argument("--version", action="version", version=f"ampdiag {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    demo = sub.add_parser("demo", help="train the embedded demo model under diagnose()")
    demo.add_argument("--out", default="reports/demo", help="output folder (reports/demo)")
    demo.add_argument(
        "--scenario",
        choices=("underflow", "amp"),
        default=None,
        help="underflow: FP16 autocast without a GradScaler, whose gradients underflow (the "
        "report shows where, the scale that fixes it and the precision A/B); amp: a correct "
        "setup in --dtype (a GradScaler in FP16) [underflow]",
    )
    demo.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when present")
    demo.add_argument(
        "--dtype",
        default=None,
        choices=("float16", "bfloat16", "float32"),
        help="the autocast dtype of --scenario amp [float16]; without --scenario it selects "
        "the amp demo (deprecated: the command line before --scenario existed)",
    )
    demo.add_argument("--steps", type=int, help="training steps [100 for underflow, 8 for amp]")

    run = sub.add_parser(
        "run",
        help="run a training script under diagnose() (like python SCRIPT ARGS)",
        description="Runs SCRIPT as __main__ with ARGS inside ampdiag.diagnose(); the "
        "flags are DiagnoseConfig's settings. Options after SCRIPT are the script's.",
    )
    run.add_argument("--out", help="output folder (default: reports/run-<time>)")
    _add_settings(run)
    run.add_argument("script", help="the Python file to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")

    report = sub.add_parser(
        "report",
        help="re-render a session, or analyze a trace",
        description="Reads a saved session, a Kineto trace, a folder of ranks' traces or "
        "sessions, or a CUDA memory snapshot, analyzes it afresh and writes the report.",
        epilog="examples:\n"
        "  ampdiag report reports/my-run                     # report.html in that folder\n"
        "  ampdiag report trace.json.gz --format console     # the summary on stdout\n"
        "  ampdiag report reports/my-run --format json | jq '.findings[].id'\n"
        "  ampdiag report traces/ --format tensorboard --out tb/\n"
        "                                  # then: tensorboard --logdir tb/tensorboard (run 'tb')\n"
        "  ampdiag report reports/my-run --fail-on high      # CI: exit 3 on a high finding",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "path",
        help="a session folder or session.json, a trace file, a folder of traces, or a "
        "CUDA memory snapshot (.pickle)",
    )
    report.add_argument(
        "--format",
        choices=tuple(RENDERERS),
        default="html",
        help="html: report.html in --out (the default); console: the summary on stdout; "
        "json: the session with fresh findings on stdout; tensorboard: event files in "
        "--out/tensorboard/; png, pdf: the figures in --out/figures/ (needs matplotlib)",
    )
    report.add_argument("--out", help="output folder (default: the session folder itself)")
    report.add_argument("--fail-on", choices=GATES, help="exit 3 if a finding this severe exists")
    report.add_argument("--hta", action="store_true", help="also run HTA's analyses (traces)")

    diff = sub.add_parser("diff", help="compare two runs (before and after a change)")
    diff.add_argument("before", help="run A: a session folder (or trace, like report PATH)")
    diff.add_argument("after", help="run B, compared with A")
    diff.add_argument(
        "--format",
        choices=("console", "html", "json"),
        default="console",
        help="console: the table on stdout (the default); html: diff.html in --out "
        "(reports/diff); json: the comparison on stdout",
    )
    diff.add_argument(
        "--out", help="write diff.html and both runs' TensorBoard data (tensorboard/<run>/) here"
    )
    return parser


def _add_settings(parser: argparse.ArgumentParser) -> None:
    """One flag per DiagnoseConfig field: ``--profile-active 5``, ``--no-speed-probe``.

    Each flag's help is the field's own documentation, so the two never drift apart.
    """
    from ampdiag.config import DiagnoseConfig, field_docs

    docs = field_docs()
    group = parser.add_argument_group("settings (DiagnoseConfig; default in brackets)")
    for f in fields(DiagnoseConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type).replace(" | None", "")
        text = f"{docs.get(f.name, '')} [{f.default}]".replace("``", "").replace("%", "%%")
        if kind == "bool":
            action = argparse.BooleanOptionalAction
            group.add_argument(flag, dest=f.name, action=action, default=SUPPRESS, help=text)
            continue
        if kind not in _FLAG_TYPES:
            raise TypeError(f"DiagnoseConfig.{f.name}: no flag for a setting of type {f.type}")
        convert, metavar = _FLAG_TYPES[kind]
        group.add_argument(
            flag, dest=f.name, type=convert, default=SUPPRESS, metavar=metavar, help=text
        )


def _window(text: str) -> tuple[int, int] | None:
    """``--steps A:B``: steps A up to B (B excluded), as `DiagnoseConfig.steps` keeps them."""
    from ampdiag.config import window_steps

    try:
        return window_steps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: A setting's type -> its flag's converter and metavar.
_FLAG_TYPES: dict[str, tuple[Callable[[str], Any], str]] = {
    "int": (int, "N"),
    "float": (float, "X"),
    "str": (str, "TEXT"),
    "tuple[int, int]": (_window, "A:B"),
}


def _cmd_run(args: argparse.Namespace) -> int:
    from ampdiag.config import TRIGGERS, DiagnoseConfig
    from ampdiag.sources.live.script import exit_code, printed, run

    settings = {
        f.name: getattr(args, f.name) for f in fields(DiagnoseConfig) if hasattr(args, f.name)
    }
    if settings.get("trigger") not in (None, *TRIGGERS):
        raise InputError(f"--trigger {settings['trigger']}: the known triggers are {TRIGGERS}")
    script = Path(args.script)
    if not script.is_file():
        raise InputError(f"no such script: {args.script!r}")
    script_args = list(args.args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    try:
        d = run(script, script_args, out=args.out, print_error=True, **settings)
    except SystemExit as exc:
        return exit_code(exc)
    except KeyboardInterrupt:
        print("ampdiag: the script was interrupted; the session was written", file=sys.stderr)
        return 130
    except Exception as exc:
        # The script's own error: its traceback was printed as it left the script, first
        # and as python would print it (run(print_error=True)); anything else here.
        if not any(e is exc for e in printed):
            import traceback

            traceback.print_exc()
        printed.clear()
        return 1
    print(f"ampdiag: {d.out}", file=sys.stderr)
    return EXIT_OK


def _cmd_diff(args: argparse.Namespace) -> int:
    from ampdiag.analysis import analyze
    from ampdiag.analysis.diff import diff_sessions, labels_for
    from ampdiag.sources import load

    a, b = load(Path(args.before)), load(Path(args.after))
    for session in (a, b):
        session.findings = analyze(session)
    d = diff_sessions(a, b, labels=labels_for(a, b))
    if args.format == "json":
        import json

        print(json.dumps(d.to_dict(), indent=1, default=str))
    elif args.format == "console" and not args.out:
        from ampdiag.render.diff import diff_text

        print(diff_text(d))
    if args.format == "html" or args.out:
        from ampdiag.render.diff import write_diff_html
        from ampdiag.render.tensorboard import write_tensorboard

        out = Path(args.out or "reports/diff")
        _check_out(out)
        path = write_diff_html(d, out)
        for session, run in zip((a, b), (d.before_label, d.after_label), strict=True):
            write_tensorboard(session, out, run=run)
        print(path)
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from ampdiag.demo import run_demo

    if args.steps is not None and args.steps < 1:
        raise InputError("--steps must be at least 1")
    if args.scenario is None and args.dtype is not None:
        # `ampdiag demo --dtype X` ran the amp demo in X before --scenario existed (0.1.0):
        # kept working for a release, with a deprecation warning (docs: compatibility policy).
        print(
            f"ampdiag: deprecated: 'ampdiag demo --dtype {args.dtype}' without --scenario runs "
            f"the amp demo; write 'ampdiag demo --scenario amp --dtype {args.dtype}' (the old "
            "form will be refused in a later release)",
            file=sys.stderr,
        )
        args.scenario = "amp"
    args.scenario = args.scenario or "underflow"
    if args.scenario == "underflow" and args.dtype not in (None, "float16"):
        raise InputError("--dtype applies to --scenario amp (the underflow demo trains in FP16)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device is available")
    out = run_demo(
        args.out,
        scenario=args.scenario,
        device=args.device,
        dtype=args.dtype or "float16",
        steps=args.steps,
    )
    print(out / REPORT_FILE)
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from ampdiag.analysis import analyze
    from ampdiag.session import SEVERITIES
    from ampdiag.sources import load

    path = Path(args.path)
    session = load(path, hta=args.hta)
    # Re-analyze: rules are pure functions of the session, and a newer ampdiag may know more.
    session.findings = analyze(session)
    renderer = RENDERERS[args.format]
    if renderer.stdout:
        renderer.write(session, Path())
    else:
        out = Path(args.out) if args.out else (session.path or path)
        if out.is_file():
            out = out.parent
        _check_out(out)
        print(renderer.write(session, out))
    if args.fail_on:
        limit = SEVERITIES.index(args.fail_on)
        worst = [f for f in session.findings if SEVERITIES.index(f.severity) <= limit]
        if worst:
            print(
                f"ampdiag: {len(worst)} finding(s) at or above {args.fail_on}: "
                + ", ".join(sorted({f.id for f in worst})),
                file=sys.stderr,
            )
            return EXIT_GATE
    return EXIT_OK


def _check_out(out: Path) -> None:
    from ampdiag._layout import check_writable  # torch-free: a report of a trace imports no torch

    check_writable(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        if args.command == "demo":
            return _cmd_demo(args)
        if args.command == "report":
            return _cmd_report(args)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "diff":
            return _cmd_diff(args)
        build_parser().print_help()
        return EXIT_INPUT
    except InputError as exc:
        print(f"ampdiag: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("ampdiag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        print(f"ampdiag: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


def console_main() -> NoReturn:
    """The ``ampdiag`` executable and ``python -m ampdiag``: :func:`main` in a fitting process.

    ``report`` and ``diff`` (:data:`REPORT_COMMANDS`) do no linear algebra, so numpy's
    OpenBLAS is kept to the calling thread instead of starting a pool of threads that would
    only spin, competing with the report for the cores (unless the user set
    ``OPENBLAS_NUM_THREADS``); and their process ends as soon as their output is flushed
    (``os._exit``) rather than tearing the interpreter down, which only frees numpy and every
    module. What that saves is measured by ``benchmarks/bench_report.py`` (figures in the
    README). ``run`` and ``demo`` start and exit normally: the user's
    script, torch and TensorBoard need their threads and may have exit work to do.
    """
    argv = sys.argv[1:]
    report = bool(argv) and argv[0] in REPORT_COMMANDS
    if report:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported
    code = main(argv)
    if report:
        _quick_exit(code)
    sys.exit(code)


def _quick_exit(code: int) -> NoReturn:
    """Flushes the standard streams and ends the process, unless another thread still runs."""
    import contextlib
    import threading

    if threading.active_count() > 1:  # not ours to cut short: a normal exit joins it
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (| head): nothing more can be written, and nothing is lost
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
