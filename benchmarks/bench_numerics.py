"""Cost of the numerics collectors (gradients, activations, scaler) on the demo model.

1. Step-time overhead: plain fp16-autocast + GradScaler training steps of TinyGPT against the
   same steps inside ``ampdiag.diagnose()`` with only the numerics collectors, interleaved
   block by block in one process. Each block times ``--period`` consecutive steps (default:
   the automatic schedule's ``sample_period``, so one block holds exactly one sampled step in
   the steady state), and the ratio of the median block totals is the amortised overhead.
   Compared: the default schedule (``sample_every=0``, timed after its first
   ``sample_first`` dense steps), and ``sample_every=1`` (every step sampled: the cost of a
   sampled step) and ``sample_every=10``. Wall-clock and this thread's CPU time (one torch
   thread: all the compute) are both printed; CPU time is what other load on a shared
   machine disturbs least.
2. A sampled step's gradient statistics (``gradients.device_stats(...).arrays()``: one
   ``_foreach_norm`` + the fused exponent histograms + getting both to the host: the one
   transfer on CUDA; on the CPU, where they are made on the host, the numpy arrays) against
   one ``torch._foreach_norm`` pass over the same gradients, interleaved (each statistics
   call right after a norm pass, as it runs right after the backward in a step). Prints the
   medians and ratio (and with the host-side bookkeeping, ``GradientsCollector._absorb``).

    python benchmarks/bench_numerics.py [--device cpu|cuda] [--blocks 8] [--stats-only]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ampdiag
from ampdiag.config import DiagnoseConfig
from ampdiag.demo import GPTConfig, TinyGPT, synthetic_batches
from ampdiag.sources.live.collectors.activations import ActivationsCollector
from ampdiag.sources.live.collectors.gradients import GradientsCollector, device_stats
from ampdiag.sources.live.collectors.scaler import ScalerCollector


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--period", type=int, default=0, help="steps per block (0: sample_period)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    ap.add_argument("--stats-only", action="store_true", help="only part 2 (no step overhead)")
    args = ap.parse_args()
    if args.threads:
        # A shared CPU makes the intra-op thread pool's timings erratic; one thread is stable.
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    defaults = DiagnoseConfig()
    period = args.period or defaults.sample_period
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = TinyGPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**12)
    data = synthetic_batches(cfg, args.batch, 4, dev)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x).view(-1, cfg.vocab), y.reshape(-1))
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scaler.step(opt)
        scaler.update()

    def run(n: int) -> tuple[float, float]:
        """n steps; their wall and CPU seconds."""
        sync(dev)
        w0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n):
            step(*data[i % len(data)])
        sync(dev)
        return time.perf_counter() - w0, time.thread_time() - c0

    for x, y in data:  # warm-up
        step(x, y)
    print(
        f"device {dev}, TinyGPT {sum(p.numel() for p in model.parameters())} params, "
        f"batch {args.batch}, threads {torch.get_num_threads()}, "
        f"numerics_sample_elements={defaults.numerics_sample_elements}, "
        f"auto schedule: every step for {defaults.sample_first}, then every "
        f"{defaults.sample_period}"
    )
    if not args.stats_only:
        step_overhead(args, period, defaults, run)
    step(*data[0])
    stats_cost(dev, [p.grad for p in model.parameters() if p.grad is not None], defaults)


def step_overhead(
    args: argparse.Namespace, period: int, defaults: DiagnoseConfig, run: Any
) -> None:
    """Part 1: the step-time overhead of the numerics collectors (see the module docstring)."""
    # name -> (diagnose settings, untimed steps inside the block before the timed ones)
    variants: dict[str, tuple[dict[str, int], int]] = {
        "default (auto)": ({}, defaults.sample_first),
        "sample_every=1": ({"sample_every": 1}, 2),
        "sample_every=10": ({"sample_every": 10}, 0),
    }
    plain: list[tuple[float, float]] = []
    watched: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    names = ["plain", *variants]
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(args.blocks):
            # Rotate the order each round, so drift and the previous block's leftovers
            # (a diagnose() exit's garbage) favour none; collect garbage before timing.
            for name in names[b % len(names) :] + names[: b % len(names)]:
                gc.collect()
                if name == "plain":
                    run(2)  # untimed, as the diagnosed blocks warm up inside their block
                    gc.collect()
                    plain.append(run(period))
                    continue
                settings, untimed = variants[name]
                collectors = [ScalerCollector(), GradientsCollector(), ActivationsCollector()]
                with ampdiag.diagnose(
                    out=Path(tmp) / f"b{b}-{names.index(name)}",
                    collectors=collectors,  # type: ignore[arg-type]
                    profile=False,
                    report=False,
                    tensorboard=False,
                    console=False,
                    **settings,
                ):
                    run(untimed)
                    gc.collect()
                    watched[name].append(run(period))
    pw = statistics.median(w for w, _ in plain)
    pc = statistics.median(c for _, c in plain)
    print(
        f"plain            {pw / period * 1e3:8.3f} ms/step wall, {pc / period * 1e3:8.3f} "
        f"ms/step CPU  ({args.blocks} blocks of {period} steps)"
    )
    for name, times in watched.items():
        mw = statistics.median(w for w, _ in times)
        mc = statistics.median(c for _, c in times)
        # paired: each round's diagnosed block against the same round's plain block
        pair = statistics.median(w / p for (w, _), (p, _) in zip(times, plain, strict=True))
        print(
            f"{name:16s} {mw / period * 1e3:8.3f} ms/step wall, {mc / period * 1e3:8.3f} "
            f"ms/step CPU: overhead {mw / pw:.3f}x wall, {mc / pc:.3f}x CPU, "
            f"{pair:.3f}x paired by round"
        )


def stats_cost(dev: torch.device, grads: list[torch.Tensor], defaults: DiagnoseConfig) -> None:
    """Part 2: a sampled step's gradient statistics against one ``_foreach_norm`` pass."""
    cache: dict[Any, Any] = {}
    limit = defaults.numerics_sample_elements
    scale = torch.full((), 2.0**12, device=dev)

    def foreach_norm() -> None:
        torch._foreach_norm(grads)
        sync(dev)

    def stats() -> None:
        device_stats(grads, limit, cache, scale).arrays()

    grad_collector = GradientsCollector()
    labels = [str(i) for i in range(len(grads))]

    def stats_and_bookkeeping() -> None:
        grad_collector._absorb(0, labels, False, device_stats(grads, limit, cache, scale))

    t_norm: list[float] = []
    t_stats: list[float] = []
    t_full: list[float] = []
    for _ in range(5):
        foreach_norm()
        stats()
    for _ in range(300):
        for fn, bucket in (
            (foreach_norm, t_norm),
            (stats, t_stats),
            (stats_and_bookkeeping, t_full),
        ):
            t0 = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - t0)
    n, s, full = (statistics.median(t) for t in (t_norm, t_stats, t_full))
    print(f"_foreach_norm pass           median {n * 1e6:9.1f} us  ({len(grads)} grads)")
    print(f"sampled-step statistics      median {s * 1e6:9.1f} us  -> {s / n:.2f}x (goal <= 2x)")
    print(f"  + host bookkeeping         median {full * 1e6:9.1f} us  -> {full / n:.2f}x")


if __name__ == "__main__":
    main()
