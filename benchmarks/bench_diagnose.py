"""A profiled step under diagnose() vs the same step under a bare torch.profiler.profile.

Both run the demo workload (TinyGPT, fp16 autocast + GradScaler, CPU) with the same profiler
settings (schedule, shapes, memory, gzipped trace handler); the two are interleaved round by
round in one process (alternating which goes first), and the per-step time of the profiled
(active) steps is compared, the last active step excluded (it exports the trace).
``diagnose()`` runs with all its default collectors (profiler, memory, precision audit,
numerics, speed probe). Wall-clock and this thread's CPU time are both printed (one torch
thread; CPU time is what other load on a shared machine disturbs least).
Goal (issue 2): median ratio at most 1.1x.

Run: .venv/bin/python -m benchmarks.bench_diagnose [--rounds 10]
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
from ampdiag.demo import GPTConfig, TinyGPT, synthetic_batches
from ampdiag.sources.live.collectors.profiler import make_schedule, profiler_activities
from benchmarks.common import median, ratio_line

SKIP, WARMUP, ACTIVE = 1, 1, 4
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


def run_bare(tmp: Path) -> list[tuple[float, float]]:
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
            t0, c0 = time.perf_counter(), time.thread_time()
            step(i)
            prof.step()
            times.append((time.perf_counter() - t0, time.thread_time() - c0))
    return times[SKIP + WARMUP : SKIP + WARMUP + ACTIVE - 1]  # the last active step exports


def run_diagnose(tmp: Path) -> tuple[list[tuple[float, float]], float]:
    step, _ = make_step(0)
    times = []
    d = ampdiag.diagnose(
        out=tmp, profile_skip=SKIP, profile_warmup=WARMUP, profile_active=ACTIVE, console=False
    )
    with d:
        for i in range(STEPS):
            t0, c0 = time.perf_counter(), time.thread_time()
            step(i)  # diagnose() advances the profiler at scaler.update()
            times.append((time.perf_counter() - t0, time.thread_time() - c0))
        t_exit = time.perf_counter()
    exit_s = time.perf_counter() - t_exit
    return times[SKIP + WARMUP : SKIP + WARMUP + ACTIVE - 1], exit_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        # A shared CPU makes the intra-op thread pool's timings erratic; one thread is stable.
        torch.set_num_threads(args.threads)
    ours: list[tuple[float, float]] = []
    base: list[tuple[float, float]] = []
    exits: list[float] = []
    paired: list[float] = []  # per round: median diagnosed step / median bare step
    with tempfile.TemporaryDirectory() as tmp:
        run_bare(Path(tmp) / "warm")  # warm-up both paths once (imports, allocator)
        run_diagnose(Path(tmp) / "warm-d")
        for r in range(args.rounds):
            # Alternate which goes first so drift and caches favour neither.
            order = ("bare", "diag") if r % 2 == 0 else ("diag", "bare")
            for which in order:
                if which == "bare":
                    bare_round = run_bare(Path(tmp) / f"b{r}")
                    base += bare_round
                else:
                    t, e = run_diagnose(Path(tmp) / f"d{r}")
                    ours += t
                    diag_round = t
                    exits.append(e)
            paired.append(median([w for w, _ in diag_round]) / median([w for w, _ in bare_round]))
    print(
        ratio_line(
            "profiled step, diagnose() vs bare torch.profiler (wall)",
            [w for w, _ in ours],
            [w for w, _ in base],
        )
    )
    print(
        ratio_line(
            "profiled step, diagnose() vs bare torch.profiler (CPU)",
            [c for _, c in ours],
            [c for _, c in base],
        )
    )
    print(
        f"paired (per-round ratio of medians, wall): median {median(paired):.3f}x, "
        f"rounds {' '.join(f'{p:.2f}' for p in paired)}"
    )
    print(
        f"diagnose() exit (analysis + session + report + tensorboard): median "
        f"{sorted(exits)[len(exits) // 2] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
