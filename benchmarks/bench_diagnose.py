"""A profiled step under diagnose() vs the same step under a bare torch.profiler.profile.

Both run the demo workload (TinyGPT, fp16 autocast + GradScaler, CPU) with the same profiler
settings (schedule, shapes, memory, gzipped trace handler); the two are interleaved round by
round in one process, and the per-step wall time of the profiled (active) steps is compared.
Goal (issue 2): median ratio at most 1.1x.

Run: .venv/bin/python benchmarks/bench_diagnose.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

import ampdiag
from ampdiag.collectors.profiler import make_schedule, profiler_activities
from ampdiag.demo import GPTConfig, TinyGPT, synthetic_batches
from benchmarks.common import ratio_line

SKIP, WARMUP, ACTIVE = 1, 1, 3
STEPS = SKIP + WARMUP + ACTIVE + 1


def make_step(seed: int) -> tuple[Callable[[int], None], int]:
    torch.manual_seed(seed)
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cpu")
    data = synthetic_batches(cfg, 8, STEPS, torch.device("cpu"), seed)

    def step(i: int) -> None:
        x, y = data[i]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x).view(-1, cfg.vocab), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step, cfg.vocab


def run_bare(tmp: Path) -> list[float]:
    step, _ = make_step(0)
    times = []
    with torch.profiler.profile(
        activities=profiler_activities(),
        schedule=make_schedule(SKIP, WARMUP, ACTIVE),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp), use_gzip=True),
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        for i in range(STEPS):
            t0 = time.perf_counter()
            step(i)
            prof.step()
            times.append(time.perf_counter() - t0)
    return times[SKIP + WARMUP : SKIP + WARMUP + ACTIVE - 1]  # the last active step exports


def run_diagnose(tmp: Path) -> tuple[list[float], float]:
    step, _ = make_step(0)
    times = []
    d = ampdiag.diagnose(
        out=tmp, profile_skip=SKIP, profile_warmup=WARMUP, profile_active=ACTIVE, console=False
    )
    with d:
        for i in range(STEPS):
            t0 = time.perf_counter()
            step(i)  # diagnose() advances the profiler at scaler.update()
            times.append(time.perf_counter() - t0)
        t_exit = time.perf_counter()
    exit_s = time.perf_counter() - t_exit
    return times[SKIP + WARMUP : SKIP + WARMUP + ACTIVE - 1], exit_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ours: list[float] = []
    base: list[float] = []
    exits: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        run_bare(Path(tmp) / "warm")  # warm-up both paths once (imports, allocator)
        run_diagnose(Path(tmp) / "warm-d")
        for r in range(args.rounds):
            # Alternate which goes first so drift and caches favour neither.
            order = ("bare", "diag") if r % 2 == 0 else ("diag", "bare")
            for which in order:
                if which == "bare":
                    base += run_bare(Path(tmp) / f"b{r}")
                else:
                    t, e = run_diagnose(Path(tmp) / f"d{r}")
                    ours += t
                    exits.append(e)
    print(ratio_line("profiled step, diagnose() vs bare torch.profiler", ours, base))
    print(
        f"diagnose() exit (analysis + session + report + tensorboard): median "
        f"{sorted(exits)[len(exits) // 2] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
