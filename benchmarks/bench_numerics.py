"""Cost of the numerics collectors (gradients, activations, scaler) on the demo model.

1. Step-time overhead: plain fp16-autocast + GradScaler training steps of TinyGPT against the
   same steps inside ``ampdiag.diagnose()`` with only the numerics collectors, at the default
   sampling period, interleaved block by block in one process. Prints the medians and ratio.
2. A sampled step's gradient statistics (one ``_foreach_norm`` + the fused exponent
   histograms + the one host copy) against one ``torch._foreach_norm`` pass over the same
   gradients, interleaved. Prints the medians and ratio (and the host-side bookkeeping).

    python benchmarks/bench_numerics.py [--device cpu|cuda] [--blocks 8] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ampdiag
from ampdiag.collectors._exponents import raw_histograms
from ampdiag.collectors._host import Deferred, pack
from ampdiag.collectors.activations import ActivationsCollector
from ampdiag.collectors.base import DiagnoseConfig
from ampdiag.collectors.gradients import GradientsCollector
from ampdiag.collectors.scaler import ScalerCollector
from ampdiag.demo import GPTConfig, TinyGPT, synthetic_batches


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        # A shared CPU makes the intra-op thread pool's timings erratic; one thread is stable.
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = TinyGPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**12)
    data = synthetic_batches(cfg, args.batch, args.steps, dev)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x).view(-1, cfg.vocab), y.reshape(-1))
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scaler.step(opt)
        scaler.update()

    def timed_steps() -> list[float]:
        out = []
        for x, y in data:
            sync(dev)
            t0 = time.perf_counter()
            step(x, y)
            sync(dev)
            out.append(time.perf_counter() - t0)
        return out

    for x, y in data[:2]:  # warm-up
        step(x, y)
    defaults = DiagnoseConfig()
    plain: list[float] = []
    periods = (defaults.sample_every, 10)
    watched: dict[int, list[float]] = {p: [] for p in periods}
    with tempfile.TemporaryDirectory() as tmp:
        for b in range(args.blocks):
            plain += timed_steps()
            for period in periods:
                collectors = [ScalerCollector(), GradientsCollector(), ActivationsCollector()]
                with ampdiag.diagnose(
                    out=Path(tmp) / f"b{b}-{period}",
                    collectors=collectors,  # type: ignore[arg-type]
                    profile=False,
                    report=False,
                    tensorboard=False,
                    console=False,
                    sample_every=period,
                ):
                    # steady state: run past step 0 (always sampled) before timing
                    timed_steps()
                    watched[period] += timed_steps()
    mp = statistics.median(plain)
    print(
        f"device {dev}, TinyGPT {sum(p.numel() for p in model.parameters())} params, "
        f"batch {args.batch}, threads {torch.get_num_threads()}, "
        f"numerics_sample_elements={defaults.numerics_sample_elements}"
    )
    print(f"plain step      median {mp * 1e3:8.3f} ms  ({len(plain)} steps)")
    for period, times in watched.items():
        mw = statistics.median(times)
        tag = " (default)" if period == defaults.sample_every else ""
        print(
            f"diagnosed step  median {mw * 1e3:8.3f} ms  sample_every={period}{tag}: "
            f"overhead {mw / mp:.3f}x  "
            f"(means: {statistics.mean(times) / statistics.mean(plain):.3f}x)"
        )

    # --- 2. sampled-step statistics vs one _foreach_norm pass ---
    step(*data[0])
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    cache: dict[tuple[object, ...], torch.Tensor] = {}
    limit = defaults.numerics_sample_elements
    scale = torch.ones((), device=dev)

    def foreach_norm() -> None:
        torch._foreach_norm(grads)
        sync(dev)

    def stats() -> list[float]:
        norms = torch.stack([n.float() for n in torch._foreach_norm(grads)])
        hists = raw_histograms(grads, limit, cache)
        return Deferred(pack([hists, norms, scale], dev)).values()

    gc = GradientsCollector()

    def stats_and_bookkeeping() -> None:
        values = stats()
        gc._absorb(0, [str(i) for i in range(len(grads))], False, _Ready(values))

    t_norm: list[float] = []
    t_stats: list[float] = []
    t_full: list[float] = []
    for _ in range(5):
        foreach_norm()
        stats()
    for _ in range(60):
        for fn, bucket in (
            (foreach_norm, t_norm),
            (stats, t_stats),
            (stats_and_bookkeeping, t_full),
        ):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            bucket.append(time.perf_counter() - t0)
    n, s, full = (statistics.median(t) for t in (t_norm, t_stats, t_full))
    print(f"_foreach_norm pass           median {n * 1e6:9.1f} us  ({len(grads)} grads)")
    print(f"sampled-step statistics      median {s * 1e6:9.1f} us  -> {s / n:.2f}x (goal <= 2x)")
    print(f"  + host bookkeeping         median {full * 1e6:9.1f} us  -> {full / n:.2f}x")


class _Ready(Deferred):
    def __init__(self, values: list[float]) -> None:
        self._values = values

    def values(self) -> list[float]:
        return self._values


if __name__ == "__main__":
    main()
