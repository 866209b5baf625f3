"""Does ``ampdiag.compare`` agree with an independent measurement of the same precisions?

For each model, the same forward + backward (surrogate loss: the output's sum) is timed here
without ampdiag, in plain interleaved rounds (every precision once per round, order rotated),
and by ``ampdiag.compare`` in the same process; it prints both medians with their spread
(half the interquartile range) and whether each of compare's medians lies within the
independent measurement's interval widened by compare's own spread.

    python -m benchmarks.bench_compare [--rounds 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from ampdiag.sources.live.compare import compare


def mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(),
                          nn.Linear(2048, 10))  # fmt: skip
    return model, torch.randn(64, 512)


def cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    return model, torch.randn(16, 3, 64, 64)


def plain_times(model: nn.Module, x: torch.Tensor, rounds: int) -> dict[str, list[float]]:
    modes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    params = [p for p in model.parameters() if p.requires_grad]
    out: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for r in range(rounds + 1):  # round 0 warms up
        for name in names[r % 3 :] + names[: r % 3]:
            dtype = modes[name]
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = model(x).float().sum()
            torch.autograd.grad(loss * (2.0**16 if name == "fp16" else 1.0), params)
            if r:
                out[name].append(time.perf_counter() - t0)
    return out


def spread(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name, make in (("mlp", mlp), ("cnn", cnn)):
        model, x = make()
        plain = plain_times(model, x, args.rounds)
        result = compare(model, x, budget_s=60, tolerance=0.02, min_samples=args.rounds)
        print(f"{name}: compare recommends {result.recommended} ({result.reason})")
        for row in result.results:
            ours = row.time_ms or float("nan")
            ours_sd = row.time_spread_ms or 0.0
            base = statistics.median(plain[row.precision]) * 1000
            base_sd = spread(plain[row.precision]) * 1000
            agree = abs(ours - base) <= ours_sd + base_sd
            print(
                f"  {row.precision:5} compare {ours:8.2f} ± {ours_sd:5.2f} ms (n={row.samples})  "
                f"plain {base:8.2f} ± {base_sd:5.2f} ms (n={len(plain[row.precision])})  "
                f"ratio {ours / base:.3f}  {'agree' if agree else 'DISAGREE'}"
            )


if __name__ == "__main__":
    main()
