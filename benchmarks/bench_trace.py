"""Speed and peak memory of ``ampdiag report TRACE`` vs HTA 0.5 (load + temporal breakdown).

Inputs: df_index_resolver (54 MB of JSON) from ../shared/traces (or $AMPDIAG_TRACES), and traces
generated from it in a temporary folder (never committed): copies of its events shifted in time
and correlation id. Every measurement runs in a fresh subprocess, imports included (wall time
from before the first import to the end; peak RSS = VmHWM of that process), interleaved,
``--repeat`` times; medians are printed.

1. 1x: ``ampdiag report --format json`` and the default HTML report (``main()`` of the CLI, as
   the ``ampdiag`` command runs it) against HTA's ``TraceAnalysis`` + ``get_temporal_breakdown``,
   and the lenient standard-library path alone (what a file the decoder cannot cut costs);
   every tool's idle and compute time agree within 1 us. 4x: the same, linear = 4.
2. Steps: the same bytes with many or few ``ProfilerStep`` spans (the other spans renamed to a
   name of the same length), 4 copies (~215 MB) with 6738 vs 69 steps and ``--steps-copies``
   copies (default 10, ~540 MB) with 16776 vs 170: the report must take at most 2x as long
   with the many steps (analysis in O(events + steps)).
3. Ranks: a folder of ``--ranks`` copies read one after the other (what the reader does) and
   by a ``concurrent.futures`` process pool (measured here only: it decides whether the reader
   should).

    python benchmarks/bench_trace.py [--repeat 3] [--skip-4x] [--skip-steps] [--ranks 2]
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Linux-only: peak RSS is read from /proc/self/status (VmHWM), which restarts at exec.

REPORT = """
import sys, time, io, contextlib, json
sys.path.insert(0, {repo!r})
t = time.perf_counter()
from ampdiag.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    code = main(["report", {path!r}, "--format", {fmt!r}, "--out", {out!r}])
dt = time.perf_counter() - t
assert code == 0, code
if {fmt!r} == "json":
    r = json.loads(buf.getvalue())["timeline"]["ranks"][0]
    idle, comp = r["idle_us"], r["compute_us"]
else:
    idle = comp = float("nan")
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(dt, int(hwm) * 1024, idle, comp)
"""

LENIENT = """
import sys, time
sys.path.insert(0, {repo!r})
t = time.perf_counter()
from pathlib import Path
import ampdiag.trace.reader as R
from ampdiag.trace.lenient import read_lenient
R.read_fast = lambda p, i=0: read_lenient(p, i)  # every file by the lenient path
from ampdiag.sources.traces import session_from_traces
r = session_from_traces(Path({path!r})).sections["timeline"]["ranks"][0]
dt = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(dt, int(hwm) * 1024, r["idle_us"], r["compute_us"])
"""

POOL = """
import sys, time
sys.path.insert(0, {repo!r})
t = time.perf_counter()
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from ampdiag.analysis.timeline import analyze_rank
from ampdiag.sources.traces import trace_files
from ampdiag.trace.reader import read_trace
files = trace_files(Path({path!r}))
with ProcessPoolExecutor(max_workers={workers}) as pool:
    ranks = [analyze_rank(rt) for rt in pool.map(read_trace, files, range(len(files)))]
dt = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(dt, int(hwm) * 1024, ranks[0]["idle_us"], ranks[0]["compute_us"])
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
print(dt, int(hwm) * 1024, row["idle_time(us)"], row["compute_time(us)"])
"""


def traces_root() -> Path:
    env = os.environ.get("AMPDIAG_TRACES")
    root = Path(env) if env else REPO.parent / "shared" / "traces"
    if not (root / "MANIFEST.tsv").is_file():
        sys.exit(f"traces not found at {root}: set AMPDIAG_TRACES")
    return root


def make_copies(src: Path, dest: Path, copies: int, steps: int | None = None) -> int:
    """``copies`` copies of the trace's events, shifted in time and ids; returns JSON bytes.

    With ``steps``: the ProfilerStep spans are replaced by ``max(steps, many)`` spans of the
    same length that tile the trace's time, of which ``steps`` are named ``ProfilerStep#N`` and
    the rest ``ProfilerStap#N`` (not steps): the files for many and few steps have the same
    bytes, only the step count differs.
    """
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    t0, shift = min(ts), max(ts) - min(ts) + 1000
    head = json.dumps(doc)[:-1] + ', "traceEvents": [\n'
    size = 0
    with gzip.open(dest, "wt", compresslevel=1, encoding="utf-8") as out:
        out.write(head)
        size += len(head)
        first = True
        host_pid = next(e["pid"] for e in events if str(e.get("name", "")).startswith("Profiler"))
        for k in range(copies):
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * shift
                args = e2.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = {**args, "correlation": args["correlation"] + k * 10_000_000}
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] += k * 10_000_000
                name = e2.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    if steps is not None:
                        continue  # replaced below
                    e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + 10 * k}"
                line = ("" if first else ",\n") + json.dumps(e2)
                first = False
                out.write(line)
                size += len(line)
        if steps is not None:
            many = STEP_COUNTS[copies][0]
            width = shift * copies / many
            every = many // steps
            for n in range(many):
                kind = "ProfilerStep" if n % every == 0 and n // every < steps else "ProfilerStap"
                span = {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"{kind}#{n:06d}",
                    "pid": host_pid,
                    "tid": host_pid,
                    "ts": round(t0 + n * width, 3),
                    "dur": round(width * 0.999, 3),
                    "args": {},
                }
                line = ",\n" + json.dumps(span)
                out.write(line)
                size += len(line)
        out.write("\n]}")
    return size + 3


STEP_COUNTS = {4: (6738, 69), 10: (16776, 170)}


def run(code: str) -> tuple[float, int, float, float, float]:
    """(seconds, peak RSS bytes, idle us, compute us, CPU seconds) of a fresh process.

    The CPU time (user + system of the whole process, interpreter start included) moves less
    than the wall time when other work shares the machine's cores.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    dt, rss, idle, comp = proc.stdout.strip().splitlines()[-1].split()
    return float(dt), int(rss), float(idle), float(comp), cpu


def report(path: Path, fmt: str, out: Path) -> str:
    return REPORT.format(repo=str(REPO), path=str(path), fmt=fmt, out=str(out))


def interleaved(
    codes: dict[str, str], repeat: int, size: int, agree: bool = True
) -> dict[str, list[float]]:
    """Runs each code ``repeat`` times, interleaved; prints medians; checks the tools agree."""
    runs: dict[str, tuple[list[float], list[int]]] = {k: ([], []) for k in codes}
    cpus: dict[str, list[float]] = {k: [] for k in codes}
    ref: tuple[float, float] | None = None
    for _ in range(repeat):
        for kind, code in codes.items():
            dt, rss, idle, comp, cpu = run(code)
            runs[kind][0].append(dt)
            runs[kind][1].append(rss)
            cpus[kind].append(cpu)
            if (
                agree and idle == idle
            ):  # not NaN: every tool's idle and compute time agree within 1 us
                ref = ref or (idle, comp)
                assert abs(idle - ref[0]) < 1 and abs(comp - ref[1]) < 1, (kind, idle, comp, ref)
    for kind, (times, peaks) in runs.items():
        t, m, c = statistics.median(times), max(peaks), statistics.median(cpus[kind])
        print(
            f"  {kind:<26} {t:6.2f} s  ({t / (size / 1e6) * 1e3:5.1f} ms/MB)  CPU {c:6.2f} s"
            f"  peak RSS {m / 1e6:6.0f} MB = {m / size:4.2f}x JSON",
            flush=True,
        )
    out = {k: v[0] for k, v in runs.items()}
    out.update({f"{k} CPU": v for k, v in cpus.items()})
    return out


def vs(times: dict[str, list[float]], base: str, ours: str) -> str:
    pairs = [b / o for b, o in zip(times[base], times[ours], strict=True)]
    return (
        f"{statistics.median(times[base]) / statistics.median(times[ours]):.1f}x (medians; "
        f"per-round {min(pairs):.1f}-{max(pairs):.1f})"
    )


def bench_size(src_dir: Path, size: int, label: str, repeat: int, tmp: Path, hta: bool) -> float:
    codes = {
        "ampdiag report --format json": report(src_dir, "json", tmp / "out"),
        "ampdiag report (HTML)": report(src_dir, "html", tmp / "out"),
    }
    if hta:
        codes["HTA 0.5"] = HTA.format(path=str(src_dir))
    if label == "1x":
        codes["lenient path alone"] = LENIENT.format(repo=str(REPO), path=str(src_dir))
    print(f"{label}: JSON {size / 1e6:.0f} MB")
    times = interleaved(codes, repeat, size)
    if hta:
        for fmt in ("ampdiag report --format json", "ampdiag report (HTML)"):
            print(f"  HTA / {fmt}: wall {vs(times, 'HTA 0.5', fmt)}")
            print(f"  HTA / {fmt}: CPU {vs(times, 'HTA 0.5 CPU', fmt + ' CPU')}")
    if label == "1x":
        ratio = vs(times, "lenient path alone", "ampdiag report --format json")
        print(f"  lenient / decoder: {ratio}")
    return statistics.median(times["ampdiag report --format json"])


def bench_steps(src: Path, copies: int, repeat: int, tmp: Path) -> None:
    many, few = STEP_COUNTS[copies]
    files = {}
    for steps in (many, few):
        folder = tmp / f"steps-{copies}-{steps}"
        folder.mkdir()
        size = make_copies(src, folder / "trace.json.gz", copies, steps)
        files[steps] = folder
    print(f"steps: {copies} copies, JSON {size / 1e6:.0f} MB (the same bytes for both)")
    codes = {f"{n} steps (json)": report(files[n], "json", tmp / "out") for n in (many, few)}
    times = interleaved(codes, repeat, size, agree=False)  # other steps: another window
    ratio = statistics.median(times[f"{many} steps (json)"]) / statistics.median(
        times[f"{few} steps (json)"]
    )
    print(f"  {many} steps / {few} steps: {ratio:.2f}x the time (must be <= 2)")
    for folder in files.values():
        shutil.rmtree(folder)


def bench_ranks(src: Path, n: int, repeat: int, tmp: Path) -> None:
    folder = tmp / "ranks"
    folder.mkdir()
    for k in range(n):
        shutil.copy(src, folder / f"rank-{k}.json.gz")
    size = n * len(gzip.decompress(src.read_bytes()))
    print(f"{n} ranks (copies of df_index_resolver), {os.cpu_count()} cores")
    codes = {
        "one after the other": report(folder, "json", tmp / "out"),
        f"process pool ({n} workers)": POOL.format(repo=str(REPO), path=str(folder), workers=n),
    }
    times = interleaved(codes, repeat, size)
    ratio = vs(times, "one after the other", f"process pool ({n} workers)")
    print(f"  one after the other / pool: {ratio}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-4x", action="store_true")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--steps-copies", type=int, default=10, choices=sorted(STEP_COUNTS))
    ap.add_argument("--ranks", type=int, default=2, help="copies in the folder-of-ranks case")
    args = ap.parse_args()
    # Byte-compile ampdiag first, as installing a package does (HTA's files were compiled when
    # pip installed it).
    compileall.compile_dir(REPO / "ampdiag", quiet=1)
    src_dir = traces_root() / "df_index_resolver"
    src = src_dir / "df_index_resolver.json.gz"
    size1 = len(gzip.decompress(src.read_bytes()))
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp_name:
        tmp = Path(tmp_name)
        one = bench_size(src_dir, size1, "1x", args.repeat, tmp, hta=True)
        if not args.skip_4x:
            big = tmp / "x4"
            big.mkdir()
            size4 = make_copies(src, big / "df_index_4x.json.gz", 4)
            four = bench_size(big, size4, "4x", args.repeat, tmp, hta=False)
            print(f"ampdiag time 4x / 1x: {four / one:.2f} (linear = 4.0)")
            shutil.rmtree(big)
        if not args.skip_steps:
            bench_steps(src, 4, args.repeat, tmp)
            if args.steps_copies != 4:
                bench_steps(src, args.steps_copies, args.repeat, tmp)
        if args.ranks > 1:
            bench_ranks(src, args.ranks, args.repeat, tmp)


if __name__ == "__main__":
    main()
