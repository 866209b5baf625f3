"""Speed and peak memory of ampdiag's trace analysis vs HTA 0.5 (load + temporal breakdown).

Inputs: df_index_resolver (54 MB of JSON) from ../shared/traces (or $AMPDIAG_TRACES) and a 4x
larger trace made from it in a temporary folder (four copies of its events, shifted in time and
correlation id; never committed). Each measurement runs in a fresh subprocess (wall time from
before the imports to the finished session; peak RSS = VmHWM of that process, plus, where the
reader forked worker processes (``ampdiag.trace.parallel``), each worker's own peak: its VmHWM
less the pages it still shares with its parent, which the parent's figure counts already; the
upper bound, every process's peak RSS in full, is printed beside it), interleaved:
ampdiag, HTA, and ampdiag with its standard-library reader only (the path taken when msgspec is
not installed, or for a file the fast path does not handle), ``--repeat`` times. Medians of the
times are printed, the largest peak RSS, and the ratios: HTA time / ampdiag time, peak RSS /
uncompressed JSON size, ampdiag time per MB of JSON, and 4x time / 1x time (linear = 4).

Last, a folder of ``--ranks`` copies of the trace (rank files), read with the reader's worker
processes and in one process (``AMPDIAG_TRACE_WORKERS=1``), interleaved.

    python benchmarks/bench_trace.py [--repeat 5] [--skip-hta-4x] [--skip-stdlib] [--ranks 4]
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Linux-only: peak RSS is read from /proc/self/status (VmHWM), which restarts at exec.

OURS = """
import sys, time
sys.path.insert(0, {repo!r})
t = time.perf_counter()
from ampdiag.sources.traces import session_from_traces
from pathlib import Path
if {stdlib!r}:
    import ampdiag.trace.reader as R
    R.FAST = False
import ampdiag.trace.reader as R
seen = []  # (processes, workers' own peak memory) of each file read
reads = R.read_traces
def recorded(paths):
    for rt in reads(paths):
        seen.append((rt.processes, sum(rt.worker_peak_bytes)))
        yield rt
R.read_traces = recorded
s = session_from_traces(Path({path!r}))
assert {stdlib!r} or s.sections["timeline"]["ranks"][0]["file"]
r = s.sections["timeline"]["ranks"][0]
dt = time.perf_counter() - t
import resource
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
# the reader's worker processes (they exit before it returns): their peak RSS in full (an
# upper bound: pages shared with this process counted twice), and their own peak
workers = max(procs for procs, _ in seen) - 1
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if workers else 0
own = max(own for _, own in seen)
print(dt, int(hwm) * 1024 + own, r["idle_us"], r["compute_us"], workers + 1,
      int(hwm) * 1024 + workers * child)
"""

HTA = """
import sys, time, warnings, logging, io, contextlib
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
with contextlib.redirect_stdout(io.StringIO()):
    ta = TraceAnalysis(trace_dir={path!r})
    tb = ta.get_temporal_breakdown(visualize=False)
dt = time.perf_counter() - t
row = tb.iloc[0]
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(dt, int(hwm) * 1024, row["idle_time(us)"], row["compute_time(us)"], 1, int(hwm) * 1024)
"""


def traces_root() -> Path:
    env = os.environ.get("AMPDIAG_TRACES")
    root = Path(env) if env else REPO.parent / "shared" / "traces"
    if not (root / "MANIFEST.tsv").is_file():
        sys.exit(f"traces not found at {root}: set AMPDIAG_TRACES")
    return root


def make_4x(src: Path, out_dir: Path) -> tuple[Path, int]:
    """Four copies of the trace's events, shifted in time and ids; returns (folder, JSON bytes)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    shift = max(ts) - min(ts) + 1000
    out = []
    for k in range(4):
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + k * shift
            args = e2.get("args")
            if isinstance(args, dict) and "correlation" in args:
                args = dict(args)
                args["correlation"] = args["correlation"] + k * 10_000_000
                e2["args"] = args
            if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                e2["id"] += k * 10_000_000
            name = e2.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + 10 * k}"
            out.append(e2)
    doc["traceEvents"] = out
    text = json.dumps(doc, indent=2).encode()
    folder = out_dir / "df_index_4x"
    folder.mkdir()
    (folder / "df_index_4x.json.gz").write_bytes(gzip.compress(text, compresslevel=1))
    return folder, len(text)


def run(code: str, env: dict[str, str] | None = None) -> tuple[float, int, float, float, int, int]:
    """(seconds, peak memory, idle us, compute us, processes, peak memory's upper bound)."""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    dt, rss, idle, comp, procs, upper = proc.stdout.strip().splitlines()[-1].split()
    return float(dt), int(rss), float(idle), float(comp), int(procs), int(upper)


def _fmt(
    label: str, times: list[float], rss: list[int], procs: list[int], upper: list[int], size: int
) -> str:
    t, m, u = statistics.median(times), max(rss), max(upper)
    line = (
        f"  {label:<16} {t:6.2f} s  ({t / (size / 1e6) * 1e3:5.1f} ms/MB)"
        f"  peak RSS {m / 1e6:6.0f} MB = {m / size:4.2f}x JSON"
    )
    if max(procs) > 1:
        line += f"  ({max(procs)} processes; every RSS in full: {u / 1e6:.0f} MB = {u / size:.2f}x)"
    return line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-hta-4x", action="store_true", help="HTA on 216 MB needs ~1.5 GB")
    ap.add_argument("--skip-stdlib", action="store_true", help="no standard-library-path row")
    ap.add_argument("--ranks", type=int, default=4, help="copies in the folder-of-ranks case")
    ap.add_argument("--make-4x", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_4x:
        folder, size = make_4x(Path(args.make_4x[0]), Path(args.make_4x[1]))
        print(folder, size)
        return
    # Byte-compile ampdiag first, as installing a package does (HTA's files were compiled when
    # pip installed it): with PYTHONDONTWRITEBYTECODE set, as on some machines, every timed
    # process would otherwise compile ampdiag's source again.
    compileall.compile_dir(REPO / "ampdiag", quiet=1)
    root = traces_root()
    src_dir = root / "df_index_resolver"
    src = src_dir / "df_index_resolver.json.gz"
    size1 = len(gzip.decompress(src.read_bytes()))
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        # made in a child process so that this one stays small (children inherit nothing big)
        made = subprocess.run(
            [sys.executable, __file__, "--make-4x", str(src), tmp],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        big_dir, size4 = Path(made[0]), int(made[1])
        medians = {}
        for label, folder, size in (("1x", src_dir, size1), ("4x", big_dir, size4)):
            runs: dict[str, tuple[list[float], list[int], list[int], list[int]]] = {}
            ref: tuple[float, float] | None = None
            kinds = ["ampdiag", "HTA 0.5"]
            if label == "4x" and args.skip_hta_4x:
                kinds.remove("HTA 0.5")
            if not args.skip_stdlib and label == "1x":
                kinds.append("ampdiag (stdlib)")
            for _ in range(args.repeat):
                for kind in kinds:
                    if kind == "HTA 0.5":
                        code = HTA.format(path=str(folder))
                    else:
                        stdlib = kind != "ampdiag"
                        code = OURS.format(repo=str(REPO), path=str(folder), stdlib=stdlib)
                    dt, rss, idle, comp, procs, upper = run(code)
                    times, peaks, nprocs, uppers = runs.setdefault(kind, ([], [], [], []))
                    times.append(dt)
                    peaks.append(rss)
                    nprocs.append(procs)
                    uppers.append(upper)
                    # every tool, every run: the same idle and compute time (within 1 us)
                    ref = ref or (idle, comp)
                    agree = abs(idle - ref[0]) < 1 and abs(comp - ref[1]) < 1
                    assert agree, (kind, idle, comp, ref)
            name = "df_index_resolver" + ("" if label == "1x" else " x4")
            print(f"{label}: {name}, JSON {size / 1e6:.0f} MB")
            for kind in kinds:
                print(_fmt(kind, *runs[kind], size), flush=True)
            ours = statistics.median(runs["ampdiag"][0])
            medians[label] = ours
            if "HTA 0.5" in runs:
                hta_times = runs["HTA 0.5"][0]
                hta = statistics.median(hta_times)
                # paired: each round's HTA run against the same round's ampdiag run (drift on
                # a shared machine moves both)
                pairs = [h / o for h, o in zip(hta_times, runs["ampdiag"][0], strict=True)]
                print(
                    f"  speed-up vs HTA: {hta / ours:.1f}x (median times), "
                    f"{statistics.median(pairs):.1f}x (median of per-round ratios, "
                    f"{min(pairs):.1f}-{max(pairs):.1f})"
                )
            if "ampdiag (stdlib)" in runs:
                slow = statistics.median(runs["ampdiag (stdlib)"][0])
                print(f"  fast path vs standard-library path: {slow / ours:.1f}x")
        print(f"ampdiag time 4x / 1x: {medians['4x'] / medians['1x']:.2f} (linear = 4.0)")
        if args.ranks > 1:
            bench_ranks(src, args.ranks, args.repeat, Path(tmp))


def bench_ranks(src: Path, n: int, repeat: int, tmp: Path) -> None:
    """A folder of ``n`` ranks (copies of ``src``): worker processes vs one process."""
    folder = tmp / "ranks"
    folder.mkdir()
    for k in range(n):
        shutil.copy(src, folder / f"rank-{k}.json.gz")
    code = OURS.format(repo=str(REPO), path=str(folder), stdlib=False)
    alone = dict(os.environ, AMPDIAG_TRACE_WORKERS="1")
    times: dict[str, list[float]] = {"workers": [], "one process": []}
    for _ in range(repeat):
        times["workers"].append(run(code)[0])
        times["one process"].append(run(code, alone)[0])
    many, one = (statistics.median(t) for t in times.values())
    print(
        f"{n} ranks (copies of df_index_resolver): {many:.2f} s with worker processes, "
        f"{one:.2f} s in one process: {one / many:.2f}x"
    )


if __name__ == "__main__":
    main()
