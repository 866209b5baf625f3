"""Steady-state step time of a 2-rank DDP job (torchrun, gloo, CPU) under diagnose() vs plain.

Each rank trains the same DDP model (a 4-layer MLP, bf16 CPU autocast, SGD) in blocks of
``--steps`` steps, a plain block and a block under ``diagnose()`` (all default collectors;
report, TensorBoard and console off, since they run after the block), interleaved round by
round with the order alternating. Steady state: the median step time from step
``profile_skip + warmup + active + 1`` on (after the profiled and first sampled steps; later
sampled steps are a minority the median ignores). Rank 0 prints the median ratio of the
rounds and of the pooled steps. Goal (issue 15): at most 1.05x.

Run: .venv/bin/python benchmarks/bench_ddp.py [--rounds 6] [--steps 60]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ampdiag

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    settled = 6  # profile_skip + warmup + active (1 + 1 + 3) + 1
    plain: list[float] = []
    watched: list[float] = []
    per_round: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            medians = {}
            for mode in ("plain", "diagnose") if r % 2 == 0 else ("diagnose", "plain"):
                block = (
                    ampdiag.diagnose(
                        model,
                        opt,
                        out=Path(tmp) / f"r{r}",
                        report=False,
                        tensorboard=False,
                        console=False,
                    )
                    if mode == "diagnose"
                    else contextlib.nullcontext()
                )
                times = []
                with block:
                    for _ in range(steps):
                        t0 = time.perf_counter()
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            loss = nn.functional.cross_entropy(model(x), y)
                        loss.backward()
                        opt.step()
                        opt.zero_grad()
                        times.append(time.perf_counter() - t0)
                steady = times[settled:]
                (watched if mode == "diagnose" else plain).extend(steady)
                medians[mode] = statistics.median(steady)
                dist.barrier()
            per_round.append(medians["diagnose"] / medians["plain"])
    if rank == 0:
        p, w = statistics.median(plain), statistics.median(watched)
        print(
            f"DDP 2 ranks, steady state: plain {p * 1000:.2f} ms, diagnose {w * 1000:.2f} ms, "
            f"pooled median ratio {w / p:.3f}x; per-round ratios "
            + ", ".join(f"{x:.3f}" for x in per_round)
            + f" (median {statistics.median(per_round):.3f}x, n={len(plain)} steps each)"
        )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.rounds, args.steps)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [__file__, "--worker", "--rounds", str(args.rounds), "--steps", str(args.steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("DDP")]
    print("\n".join(lines) if lines else done.stdout[-2000:] + done.stderr[-2000:])
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
