"""Does a long run stay flat? Process memory (RSS) after 1k, 10k and 100k tiny steps.

A tiny model (16 -> 32 -> 4, batch 8, bf16 CPU autocast, GradScaler enabled so the scaler's
history is exercised) trains under ``diagnose()`` with the collectors that run on every step
(numerics, memory) and without the profiler, the precision audit and the speed probe, so that
100k steps take about a minute. The same loop without ``diagnose()`` is the baseline. Printed:
RSS at each mark for both, the growth per 1k steps between the 10k and 100k marks, and the size
of the session.json written.

Run: .venv/bin/python -m benchmarks.bench_longrun [--steps 100000]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import ampdiag

MARKS = (1_000, 10_000, 100_000)


def rss_mib() -> float:
    """Resident set size of this process, from /proc (MiB)."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(steps: int, out: Path | None) -> dict[int, float]:
    """Trains ``steps`` steps (under diagnose() when ``out`` is given); RSS at each mark."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    marks: dict[int, float] = {}
    ctx = (
        ampdiag.diagnose(
            out=out,
            profile=False,
            precision=False,
            speed_probe=False,
            report=False,
            tensorboard=False,
            console=False,
        )
        if out is not None
        else contextlib.nullcontext()
    )
    with ctx:
        for step in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if step in MARKS:
                gc.collect()
                marks[step] = rss_mib()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MARKS[-1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        base = run(args.steps, None)
        t1 = time.perf_counter()
        ours = run(args.steps, Path(tmp) / "run")
        t2 = time.perf_counter()
        session_bytes = (Path(tmp) / "run" / "session.json").stat().st_size
    print(f"{'steps':>8} {'plain RSS MiB':>14} {'diagnose() RSS MiB':>19}")
    for mark in sorted(ours):
        print(f"{mark:>8} {base[mark]:>14.1f} {ours[mark]:>19.1f}")
    if 10_000 in ours and 100_000 in ours:
        per_k = (ours[100_000] - ours[10_000]) / 90
        base_k = (base[100_000] - base[10_000]) / 90
        print(
            f"growth 10k->100k: diagnose() {per_k * 1024:.1f} KiB per 1k steps "
            f"(plain {base_k * 1024:.1f} KiB per 1k steps)"
        )
    print(
        f"session.json: {session_bytes / 2**20:.2f} MiB; time: plain {t1 - t0:.1f} s, "
        f"diagnose() {t2 - t1:.1f} s"
    )


if __name__ == "__main__":
    main()
