"""What ``ampdiag run`` costs on training scripts written like real ones, against ``python``.

The scripts (``benchmarks/realscripts/``) are written here in the style of minGPT's trainer (a
generate-every-N callback, DataLoader workers, clipping, AdamW) and nanoGPT's ``train.py``
(autocast, gradient accumulation, an eval loop every N iterations), and, with ``--script``,
loops in the style of an Accelerate trainer with an EMA copy, of timm's ``train.py``, of an HF
``Trainer`` run and of denoising-diffusion-pytorch's ``Trainer`` on its UNet (``unet``: 152
leaf modules under emulated BF16, what the exit's precision A/B costs most on). Each round
runs every script plainly (``python script.py``) and diagnosed (``python -m ampdiag run
script.py``) as fresh processes, in alternating order, so the machine's drift lands on both
alike. Measured
from outside: the process's wall time, and the script's own block (its ``BLOCK_START`` to
``BLOCK_END`` lines); the diagnosed exit is the process's end less ``BLOCK_END``, in wall
time and in CPU time (the process's, its children's included, less its own at ``BLOCK_END``,
which a busy machine does not stretch). The plain run's exit (its end less its
``BLOCK_END``) is the interpreter's teardown, which every torch
process pays (its garbage collections over torch's objects: about 0.4-0.7 s here) and which
ampdiag cannot shorten: ampdiag's own exit is the diagnosed exit less the plain one (medians).
Printed per script: the medians, the wall ratio, whether the targets hold (a diagnosed run at
most 1.5x the plain wall time + 2 s; ampdiag's own exit at most max(1 s, 10% of its block),
the whole exit printed beside it), and any stderr line that names a native profiler log.

    flock /tmp/bench.lock python -m benchmarks.bench_realscripts [--rounds 5] [--script mingpt]
        [--flags "--no-speed-probe"]
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = {
    "mingpt": (HERE / "realscripts" / "mingpt_like.py", ["--iters", "30", "--gen-every", "10"]),
    "nanogpt": (HERE / "realscripts" / "nanogpt_like.py", ["--iters", "20"]),
    "accelerate_ema": (HERE / "realscripts" / "accelerate_ema_like.py", ["--steps", "20"]),
    "unet": (HERE / "realscripts" / "unet_like.py", ["--steps", "20"]),
    "timm": (HERE / "realscripts" / "timm_like.py", []),
    "hf_trainer": (HERE / "realscripts" / "hf_trainer_like.py", ["--steps", "20"]),
}
NATIVE = ("CPUAllocator", "USDT:", "STAGE:", "SyncActivityProfilerHandler")


def _once(
    script: Path, args: list[str], diagnosed: bool, out: Path, flags: list[str]
) -> dict[str, Any]:
    cmd = [sys.executable]
    if diagnosed:
        cmd += ["-m", "ampdiag", "run", "--out", str(out), *flags]
    cmd += [str(script), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    t1 = time.time()
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    marks: dict[str, float] = {}
    steps: list[float] = []
    digest = ""
    for line in proc.stdout.splitlines():
        if line.startswith(("BLOCK_START ", "BLOCK_END ", "LOOP_START ")):
            key, value, *cpu = line.split()  # BLOCK_END: the process's CPU time too
            marks[key] = float(value)
            if cpu:
                marks["BLOCK_END_CPU"] = float(cpu[0])
        elif line.startswith("STEP "):
            steps.append(float(line.split()[2]))
        elif line.startswith("DIGEST "):
            digest = line.split()[1]
    # the scripts that print LOOP_START and STEP lines: the first step (loop start to the
    # first optimizer step's end) and the median later step
    first = steps[0] - marks["LOOP_START"] if steps and "LOOP_START" in marks else float("nan")
    later = [b - a for a, b in itertools.pairwise(steps)]
    return {
        "wall_s": t1 - t0,
        "cpu_s": (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime),
        "first_s": first,
        "later_s": statistics.median(later) if later else float("nan"),
        "loop_s": steps[-1] - marks["LOOP_START"] if steps and "LOOP_START" in marks else 0.0,
        "digest": digest,
        "block_s": marks["BLOCK_END"] - marks["BLOCK_START"],
        "exit_s": t1 - marks["BLOCK_END"],
        "exit_cpu_s": (c1.ru_utime + c1.ru_stime)
        - (c0.ru_utime + c0.ru_stime)
        - marks.get("BLOCK_END_CPU", float("nan")),
        "native_lines": [ln for ln in proc.stderr.splitlines() if any(n in ln for n in NATIVE)],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--script", action="append", choices=sorted(SCRIPTS))
    p.add_argument("--flags", default="", help="ampdiag run's settings, e.g. '--no-speed-probe'")
    a = p.parse_args(argv)
    names = a.script or ["mingpt", "nanogpt"]  # the others: --script (docs/benchmarks.md)
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name in names:
                script, args = SCRIPTS[name]
                order = (False, True) if r % 2 == 0 else (True, False)
                for diagnosed in order:
                    out = Path(tmp) / f"{name}-{r}"
                    got = _once(script, args, diagnosed, out, a.flags.split())
                    runs.setdefault((name, diagnosed), []).append(got)
    print(f"load average at the end: {os.getloadavg()}")
    for name in names:
        plain, diag = runs[(name, False)], runs[(name, True)]
        med = {k: statistics.median(x[k] for x in diag) for k in ("wall_s", "block_s", "exit_s")}
        base = statistics.median(x["wall_s"] for x in plain)
        base_block = statistics.median(x["block_s"] for x in plain)
        base_exit = statistics.median(x["exit_s"] for x in plain)  # interpreter teardown
        own_cpu = statistics.median(x["exit_cpu_s"] for x in diag) - statistics.median(
            x["exit_cpu_s"] for x in plain
        )
        exit_budget = max(1.0, 0.1 * med["block_s"])
        own_exit = med["exit_s"] - base_exit
        native = sum(len(x["native_lines"]) for x in diag)
        print(
            f"{name}: plain {base:.2f} s (block {base_block:.2f} s), "
            f"diagnosed {med['wall_s']:.2f} s "
            f"(block {med['block_s']:.2f} s, exit {med['exit_s']:.2f} s; plain's "
            f"{base_exit:.2f} s, so ampdiag's own {own_exit:.2f} s), "
            f"ratio {med['wall_s'] / base:.2f}x (n={len(diag)})"
        )
        print(
            f"  target wall <= 1.5x + 2 s = {1.5 * base + 2:.2f} s: "
            f"{'holds' if med['wall_s'] <= 1.5 * base + 2 else 'MISSED'}; "
            f"ampdiag's own exit <= {exit_budget:.2f} s: "
            f"{'holds' if own_exit <= exit_budget else 'MISSED'} "
            f"(the whole exit, teardown included: "
            f"{'holds' if med['exit_s'] <= exit_budget else 'over'}; in CPU time, which a "
            f"busy machine does not stretch, {own_cpu:.2f} s: "
            f"{'holds' if own_cpu <= exit_budget else 'MISSED'}); "
            f"native log lines on stderr: {native}"
        )
        if not any(x["first_s"] == x["first_s"] for x in plain):  # no STEP lines
            continue

        def m(xs: list[dict[str, Any]], k: str) -> float:
            return float(statistics.median(x[k] for x in xs))

        same = {x["digest"] for x in plain} == {x["digest"] for x in diag}
        print(
            f"  first step {m(plain, 'first_s'):.3f} s plain, {m(diag, 'first_s'):.3f} s "
            f"diagnosed; later steps {1e3 * m(plain, 'later_s'):.1f} ms plain, "
            f"{1e3 * m(diag, 'later_s'):.1f} ms diagnosed "
            f"({m(diag, 'later_s') / m(plain, 'later_s'):.2f}x); process CPU "
            f"{m(plain, 'cpu_s'):.2f} s plain, {m(diag, 'cpu_s'):.2f} s diagnosed; "
            f"weights digest {'identical' if same else 'DIFFERENT'}"
        )


if __name__ == "__main__":
    main()
