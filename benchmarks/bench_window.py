"""What a closed window costs: the steps outside ``diagnose(steps=...)`` against a plain loop.

A small MLP (256 -> 512 -> 10, batch 64, bf16 CPU autocast, SGD) trains ``--steps`` steps: plain,
under ``diagnose(steps=(S, S + 3))`` with the window at the very end (so every step timed is
outside it: the step watch and the run-wide sentinel; ``steps-no-sentinel``, with
``sentinel=False``, the step watch alone), and under ``diagnose(trigger="loss-spike")``
with a loss that
never spikes (the watch plus the loss read of each step). Each step is timed by the loop itself
(``perf_counter`` around forward, backward and update); the rounds are interleaved, and the
figure is the median step time of each variant (the window's own steps and the exit excluded).

Run: .venv/bin/python -m benchmarks.bench_window [--steps 400 --rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ampdiag

QUIET: dict[str, Any] = {"report": False, "tensorboard": False, "console": False}


def run(steps: int, ctx: AbstractContextManager[Any]) -> list[float]:
    """Per-step wall times of ``steps`` steps inside ``ctx``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times: list[float] = []
    with ctx:
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.steps
    timed = slice(10, n - 10)  # warm-up excluded; the window (last 3 steps) never timed
    results: dict[str, list[float]] = {
        "plain": [],
        "steps": [],
        "steps-no-sentinel": [],
        "trigger": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            variants: dict[str, AbstractContextManager[Any]] = {
                "plain": nullcontext(),
                "steps": ampdiag.diagnose(
                    out=Path(tmp, f"s{r}"), steps=(n - 3, n), speed_probe=False, **QUIET
                ),
                "steps-no-sentinel": ampdiag.diagnose(
                    out=Path(tmp, f"n{r}"),
                    steps=(n - 3, n),
                    speed_probe=False,
                    sentinel=False,
                    **QUIET,
                ),
                "trigger": ampdiag.diagnose(
                    out=Path(tmp, f"t{r}"), trigger="loss-spike", speed_probe=False, **QUIET
                ),
            }
            for name, ctx in variants.items():
                results[name].extend(run(n, ctx)[timed])
    base = statistics.median(results["plain"])
    print(f"plain loop: median step {base * 1e6:.1f} us (n={len(results['plain'])})")
    for name in ("steps", "steps-no-sentinel", "trigger"):
        m = statistics.median(results[name])
        print(
            f"outside the window, {name}: median step {m * 1e6:.1f} us, "
            f"{m / base:.3f}x the plain step ({(m - base) * 1e6:+.1f} us)"
        )


if __name__ == "__main__":
    main()
