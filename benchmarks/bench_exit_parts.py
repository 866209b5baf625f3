"""Where ``ampdiag run``'s exit goes on a real-style script: each part timed in the process.

Each round is a fresh ``ampdiag run`` of the script (``benchmarks/realscripts/``) in a child
process whose exit path is wrapped with ``time.perf_counter`` timers (``--cpu``: process CPU
time, which a busy machine does not stretch): the hooks' removal (``stop``), each collector's
``after_stop`` (the speed probe's precision A/B's observed, timed and per-module passes apart,
each precision's within them, the observed passes' numerics apart; the profiler's trace export
and gzip apart), each collector's ``section`` (the trace's one read apart), the analysis, the
session's save and each renderer; last, the script's ``BLOCK_END`` to the last ``atexit``
handler (all of ampdiag's exit, not the interpreter's teardown after it: see
``bench_realscripts``), and the garbage collections within it by generation. Printed: the median
of each part over the rounds, in milliseconds, largest parts first within their stage.

    flock /tmp/bench.lock python -m benchmarks.bench_exit_parts [--script nanogpt] [--rounds 3]
        [--cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.bench_realscripts import ROOT, SCRIPTS

CHILD = r"""
import atexit, builtins, functools, json, shutil, sys, time
parts = {}

def timed(owner, name, label):
    f = getattr(owner, name)
    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            key = label(a, k) if callable(label) else label
            parts[key] = parts.get(key, 0.0) + time.perf_counter() - t0
    setattr(owner, name, g)

import torch.profiler.profiler as tpp
import ampdiag.analysis as analysis
import ampdiag.render.console as console
import ampdiag.render.html as html
import ampdiag.render.tensorboard as tb
import ampdiag.session as session
import ampdiag.sources.live.collectors as collectors
import ampdiag.sources.live.collectors.base as base
import ampdiag.sources.live.collectors.profiler as profiler
import ampdiag.sources.live.compare as compare
import ampdiag.sources.live.diagnosis as diagnosis
import ampdiag.sources.live.collectors.speed_probe as speed_probe

D = diagnosis.Diagnosis
timed(D, "stop", "1 stop: hooks removed")
timed(D, "_after_stop", "2 after_stop")
timed(D, "_build_session", "3 session built")
timed(analysis, "analyze", "4 analyze")
timed(session.Session, "save", "5 session.save")
timed(html, "write_html", "6 render: html")
timed(tb, "write_tensorboard", "6 render: tensorboard")
timed(console, "summary", "6 render: console")
timed(speed_probe, "copy_of", "2 after_stop: speed probe: the model's copy")
timed(speed_probe, "compare", "2 after_stop: speed probe: A/B in all")
timed(compare, "_observe_all", "2 after_stop: speed probe: A/B observed passes")
timed(compare, "_time_all", "2 after_stop: speed probe: A/B timed rounds")
timed(compare, "_module_costs", "2 after_stop: speed probe: A/B per-module passes")
timed(compare, "_numerics", "2 after_stop: speed probe: A/B observed passes: numerics")
timed(
    compare._Runner,
    "run",
    lambda a, k: "2 after_stop: speed probe: A/B "
    + (f"observed passes: {a[1]}" if k.get("observe") else f"timed rounds: {a[1]}"),
)
timed(tpp.profile, "export_chrome_trace", "2 after_stop: profiler: export_chrome_trace")
timed(shutil, "copyfileobj", "2 after_stop: profiler: gzip")
timed(profiler, "top_ops", "2 after_stop: profiler: top ops (CUDA)")
timed(base.RunContext, "read_trace", "2 after_stop: profiler: the trace read (shared)")
for cls in collectors.registered():
    if "after_stop" in cls.__dict__:
        timed(cls, "after_stop", f"2 after_stop: {cls.name}")
    if "section" in cls.__dict__:
        timed(cls, "section", f"3 session built: {cls.name}.section")

import gc
_gc = {}
def gc_timer(phase, info):
    if not end:
        return
    if phase == "start":
        _gc["t"] = time.perf_counter()
    elif "t" in _gc:
        key = f"8 garbage collections (within the above): generation {info['generation']}"
        parts[key] = parts.get(key, 0.0) + time.perf_counter() - _gc.pop("t")
gc.callbacks.append(gc_timer)

end = []
_print = builtins.print
def marking(*a, **k):
    if a and isinstance(a[0], str) and a[0].startswith("BLOCK_END"):
        end.append(time.perf_counter())
    return _print(*a, **k)
builtins.print = marking

@atexit.register  # registered first: runs last of the handlers
def report():
    if end:
        parts["9 BLOCK_END to the last atexit handler"] = time.perf_counter() - end[0]
    sys.__stderr__.write("PARTS " + json.dumps(parts) + "\n")

from ampdiag.cli import main
sys.argv = ["ampdiag", *sys.argv[1:]]
sys.exit(main())
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", choices=sorted(SCRIPTS), default="nanogpt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="process CPU time (a busy machine)")
    a = p.parse_args(argv)
    script, args = SCRIPTS[a.script]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            child = CHILD.replace("perf_counter", "process_time") if a.cpu else CHILD
            cmd = [sys.executable, "-c", child, "run", "--out", f"{tmp}/{r}", str(script), *args]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            line = next((x for x in proc.stderr.splitlines() if x.startswith("PARTS ")), None)
            if proc.returncode != 0 or line is None:
                raise RuntimeError(f"round {r} failed:\n{proc.stderr[-3000:]}")
            runs.append(json.loads(line.removeprefix("PARTS ")))
    names = sorted({k for run in runs for k in run})
    med = {k: statistics.median(run.get(k, 0.0) for run in runs) for k in names}
    clock = "CPU" if a.cpu else "wall"
    print(f"{a.script}: ampdiag run's exit, {clock} ms, medians of {a.rounds} rounds")
    print(f"load average at the end: {os.getloadavg()}")
    for k in sorted(names, key=lambda k: (k.split(" ", 1)[0], k.count(":"), -med[k])):
        if med[k] >= 0.0005:
            print(f"  {med[k] * 1e3:8.1f}  {k[2:]}")


if __name__ == "__main__":
    main()
