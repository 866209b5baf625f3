"""Does ``ampdiag.compare`` agree with an independent measurement of the same precisions?

For each model the same forward + backward (surrogate loss: the output's sum, FP16 with a loss
scale of 2^16) is timed two ways, **interleaved round by round** so that the machine's drift
lands on both alike, both on compare's clock (`compare.CLOCK`: process CPU time on a CPU):

- *plain*: a loop written here without ampdiag, every precision once per round (order rotated);
- *compare*: one ``ampdiag.compare`` call per round, stopped after its first timed round
  (``budget_s=0``): its deep copy, warm-up (the observed runs) and timed run of every
  precision, exactly as a longer call times each of its rounds.

Which of the two goes first alternates from round to round. For each precision it prints the
median of each series, its median absolute deviation (the spread compare states,
`ampdiag.timing`), the ratio, and whether they agree: ``|compare - plain| <= spread_compare +
spread_plain``. Last, one full ``compare`` call (its own rounds, ``--rounds`` of them) states
its median ± spread, shown beside the plain series.

    flock /tmp/bench.lock python -m benchmarks.bench_compare [--rounds 9] [--threads 1]
        [--models mlp,cnn]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

from ampdiag import timing
from ampdiag.sources.live.compare import CLOCK, FP16_LOSS_SCALE, compare

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


def plain_round(model: nn.Module, x: torch.Tensor, r: int) -> dict[str, float]:
    """One round of every precision (order rotated by ``r``), ms, timed without ampdiag."""
    params = [p for p in model.parameters() if p.requires_grad]
    out: dict[str, float] = {}
    names = list(MODES)
    for name in names[r % 3 :] + names[: r % 3]:
        dtype = MODES[name]
        t0 = CLOCK()  # compare's own clock on a CPU (process CPU time)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(x).float().sum()
        torch.autograd.grad(loss * (FP16_LOSS_SCALE if name == "fp16" else 1.0), params)
        out[name] = (CLOCK() - t0) * 1000
    return out


def compare_round(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """One ``compare`` call stopped after its first timed round, ms per precision."""
    result = compare(model, x, budget_s=0.0, min_samples=1)
    return {r.precision: r.time_ms for r in result.results if r.time_ms is not None}


def measure(
    model: nn.Module, x: torch.Tensor, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    plain: dict[str, list[float]] = {m: [] for m in MODES}
    ours: dict[str, list[float]] = {m: [] for m in MODES}
    plain_round(model, x, 0)  # warm-up (compare warms itself up with its observed runs)
    for r in range(rounds):
        arms = ("plain", "compare") if r % 2 == 0 else ("compare", "plain")
        for arm in arms:
            got = plain_round(model, x, r) if arm == "plain" else compare_round(model, x)
            for k, v in got.items():
                (plain if arm == "plain" else ours)[k].append(v)
    return plain, ours


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,cnn")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.rounds} rounds, plain and compare interleaved round by round, "
          f"{args.threads} thread(s)")  # fmt: skip
    total = agreed = 0
    for name in args.models.split(","):
        model, x = {"mlp": mlp, "cnn": cnn}[name]()
        plain, ours = measure(model, x, args.rounds)
        full = compare(model, x, budget_s=600, tolerance=1.0, min_samples=args.rounds)
        print(f"{name}: a full compare recommends {full.recommended} ({full.reason})")
        base = statistics.median(plain["fp32"])
        for prec in MODES:
            c, p = statistics.median(ours[prec]), statistics.median(plain[prec])
            csd, psd = timing.estimate(ours[prec]).spread, timing.estimate(plain[prec]).spread
            agree = abs(c - p) <= csd + psd
            total += 1
            agreed += agree
            row = full.result(prec)
            print(
                f"  {prec:5} compare {c:9.3f} ± {csd:7.3f} ms   plain {p:9.3f} ± {psd:7.3f} ms   "
                f"ratio {c / p:.3f}   plain vs fp32 {p / base:6.2f}x   "
                f"{'agree' if agree else 'DISAGREE'}   | full compare {row.time_ms or 0:9.3f} ± "
                f"{row.time_spread_ms or 0:7.3f} ms (n={row.samples})"
            )
    print(f"rows agreeing within the stated spread: {agreed}/{total}")


if __name__ == "__main__":
    main()
