"""What a user waits for: ``ampdiag report TRACE`` (HTML and JSON) against HTA 0.5's load +
temporal breakdown, on the 54 MB df_index_resolver trace; and the cost of the figures.

Each measurement is a fresh process, timed from before it starts to after it exits (imports,
interpreter start-up and writing the output included), the three kinds interleaved
``--repeat`` times; medians and the ratios HTA / ampdiag are printed, of wall time and of the
process's CPU time (user + system: what a loaded machine does not inflate much). Then, in this
process, the HTML rendering alone of that trace's session (sections, SVG figures, template), and the
PNG drawing of the same figures with matplotlib for comparison (what TensorBoard pays).

    python benchmarks/bench_report.py [--repeat 5] [--trace PATH]
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HTA = """
import io, contextlib, logging, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
with contextlib.redirect_stdout(io.StringIO()):
    TraceAnalysis(trace_dir={folder!r}).get_temporal_breakdown(visualize=False)
"""


def timed(cmd: list[str], **kwargs: object) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process, start-up to exit (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def render_costs(trace: Path, repeat: int) -> tuple[float, int]:
    """Median seconds of rendering the HTML (its figures as inline SVG), and its size."""
    from ampdiag.analysis import analyze
    from ampdiag.render.html import render_html
    from ampdiag.sources.traces import session_from_traces

    session = session_from_traces(trace)
    session.findings = analyze(session)
    html_s = []
    size = 0
    for _ in range(repeat):
        t = time.perf_counter()
        size = len(render_html(session).encode())
        html_s.append(time.perf_counter() - t)
    return statistics.median(html_s), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    default = REPO.parent / "shared" / "traces" / "df_index_resolver" / "df_index_resolver.json.gz"
    ap.add_argument("--trace", type=Path, default=default)
    args = ap.parse_args()
    if not args.trace.is_file():
        sys.exit(f"no trace at {args.trace}")
    compileall.compile_dir(REPO / "ampdiag", quiet=1)  # as an installed package would be
    env = dict(os.environ, PYTHONPATH=str(REPO))
    times: dict[str, list[tuple[float, float]]] = {"html": [], "json": [], "hta": []}
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        folder = Path(tmp) / "trace"
        folder.mkdir()
        (folder / args.trace.name).symlink_to(args.trace.resolve())
        ampdiag = [sys.executable, "-m", "ampdiag", "report", str(args.trace)]
        for i in range(args.repeat):
            out = Path(tmp) / f"out{i}"
            times["html"].append(timed([*ampdiag, "--out", str(out)], env=env))
            times["json"].append(timed([*ampdiag, "--format", "json"], env=env))
            code = HTA.format(folder=str(folder))
            times["hta"].append(timed([sys.executable, "-c", code], env=env))
    print(f"trace: {args.trace} ({args.trace.stat().st_size / 1e6:.1f} MB gzipped)")
    print(f"fresh processes, interleaved, n={args.repeat}, medians (all runs in seconds):")
    for i, clock in enumerate(("wall", "CPU")):
        med = {k: statistics.median(t[i] for t in v) for k, v in times.items()}
        for kind, label in (
            ("html", "ampdiag report (HTML)"),
            ("json", "ampdiag report --format json"),
            ("hta", "HTA 0.5 load + temporal breakdown"),
        ):
            runs = ", ".join(f"{t[i]:.2f}" for t in times[kind])
            print(f"  {clock:4s} {label:36s} {med[kind]:6.2f} s   [{runs}]")
        print(f"  {clock:4s} HTA / ampdiag HTML: {med['hta'] / med['html']:.1f}x")
        print(f"  {clock:4s} HTA / ampdiag JSON: {med['hta'] / med['json']:.1f}x")
    html_s, size = render_costs(args.trace, args.repeat)
    print(f"rendering the HTML alone (SVG figures): {html_s * 1000:.0f} ms, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
