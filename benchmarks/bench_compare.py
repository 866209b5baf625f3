"""Does ``ampdiag.compare`` agree with an independent measurement of the same precisions?

For each model the same forward + backward (surrogate loss: the output's sum, FP16 with a loss
scale of 2^16) is timed two ways, **interleaved block by block** so that the machine's drift
lands on both alike:

- *plain*: a loop written here without ampdiag, every precision once per round (order rotated),
  ``--rounds`` rounds per block;
- *compare*: one ``ampdiag.compare`` call (its own interleaved rounds, ``--rounds`` of them).

A repetition is one plain block and one compare call; which goes first alternates. For each
precision it prints the median over the repetitions of compare's median and of the plain
block's median, their ratio, the typical stated spread of each (half the interquartile range),
and whether compare's figure agrees with the plain one: ``|compare - plain| <= spread_compare +
spread_plain`` (medians and median spreads over the repetitions), with the count of single
repetitions that agree.

    flock /tmp/bench.lock python -m benchmarks.bench_compare [--reps 7] [--rounds 7] [--threads 1]
        [--models mlp,cnn]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ampdiag.sources.live.compare import FP16_LOSS_SCALE, compare

MODES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


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
    return model, torch.randn(16, 3, 32, 32)


def spread(xs: list[float]) -> float:
    """Half the interquartile range (compare's own definition)."""
    if len(xs) < 2:
        return float("nan")
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


def plain_block(model: nn.Module, x: torch.Tensor, rounds: int) -> dict[str, list[float]]:
    """``rounds`` interleaved rounds of every precision, in ms, timed without ampdiag."""
    params = [p for p in model.parameters() if p.requires_grad]
    out: dict[str, list[float]] = {m: [] for m in MODES}
    names = list(MODES)
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            dtype = MODES[name]
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = model(x).float().sum()
            torch.autograd.grad(loss * (FP16_LOSS_SCALE if name == "fp16" else 1.0), params)
            out[name].append((time.perf_counter() - t0) * 1000)
    return out


@dataclass
class Row:
    """One precision's figures over the repetitions."""

    compare_ms: list[float] = field(default_factory=list)
    compare_sd: list[float] = field(default_factory=list)
    plain_ms: list[float] = field(default_factory=list)
    plain_sd: list[float] = field(default_factory=list)

    def agrees(self, i: int) -> bool:
        diff = abs(self.compare_ms[i] - self.plain_ms[i])
        return diff <= self.compare_sd[i] + self.plain_sd[i]


def measure(
    model: nn.Module, x: torch.Tensor, reps: int, rounds: int
) -> tuple[dict[str, Row], list[str]]:
    rows = {m: Row() for m in MODES}
    recommended: list[str] = []
    plain_block(model, x, 1)  # warm-up (compare warms itself up with its observed runs)
    for rep in range(reps):
        plain: dict[str, list[float]] = {}
        result = None
        for first in (True, False) if rep % 2 == 0 else (False, True):
            if first:
                plain = plain_block(model, x, rounds)
            else:
                # tolerance 1.0: stop after exactly min_samples rounds (the budget is not hit)
                result = compare(model, x, budget_s=600, tolerance=1.0, min_samples=rounds)
        assert result is not None
        recommended.append(str(result.recommended))
        for r in result.results:
            row = rows[r.precision]
            row.compare_ms.append(r.time_ms or float("nan"))
            row.compare_sd.append(r.time_spread_ms or 0.0)
            row.plain_ms.append(statistics.median(plain[r.precision]))
            row.plain_sd.append(spread(plain[r.precision]))
    return rows, recommended


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,cnn")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.reps} interleaved repetitions of {args.rounds} rounds, {args.threads} thread(s)")
    total = agreed = 0
    for name in args.models.split(","):
        model, x = {"mlp": mlp, "cnn": cnn}[name]()
        rows, recommended = measure(model, x, args.reps, args.rounds)
        print(f"{name}: compare recommended {', '.join(recommended)}")
        base = statistics.median(rows["fp32"].plain_ms)
        for prec, row in rows.items():
            c, p = statistics.median(row.compare_ms), statistics.median(row.plain_ms)
            csd, psd = statistics.median(row.compare_sd), statistics.median(row.plain_sd)
            agree = abs(c - p) <= csd + psd
            single = sum(row.agrees(i) for i in range(len(row.compare_ms)))
            total += 1
            agreed += agree
            print(
                f"  {prec:5} compare {c:9.3f} ± {csd:7.3f} ms   plain {p:9.3f} ± {psd:7.3f} ms   "
                f"compare/plain {c / p:.3f}   plain vs fp32 {p / base:6.2f}x   "
                f"{'agree' if agree else 'DISAGREE'} (single reps {single}/{len(row.compare_ms)})"
            )
    print(f"rows agreeing within the stated spread: {agreed}/{total}")


if __name__ == "__main__":
    main()
