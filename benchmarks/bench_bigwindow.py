"""The exit of a block whose steps are long and full of small ops (LBFGS over an LSTM).

pytorch/examples' time_sequence_prediction: float64 LSTMCells unrolled over the sequence,
LBFGS with 20 closure evaluations per optimizer step, millions of small host ops per step.
Printed: the plain run's time, the block's time under ``diagnose()`` (its steps) and the
exit's (``__exit__``: export, reading back, analysis, report), in seconds.

    flock /tmp/bench.lock python -m benchmarks.bench_bigwindow [--length 200] [--steps 3]
        [--long-step-s 2.0] [--profile-exit FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import tempfile
import time
from typing import Any

import torch
from torch import nn

import ampdiag
from tests.compat_suite.test_optimizer_patterns import Sequence


def steps(block: Any, length: int, n: int) -> float:
    """Runs ``n`` LBFGS steps inside ``block`` (entered here, not exited); their seconds."""
    torch.manual_seed(0)
    t = torch.arange(length, dtype=torch.float64) + torch.randint(-8, 8, (20, 1))
    data = torch.sin(t / 20.0)
    x, y = data[:, :-1], data[:, 1:]
    model = Sequence(51).double()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8)
    t0 = time.perf_counter()
    block.__enter__()
    for _ in range(n):

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=200)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--profile-exit", default="")
    ap.add_argument("--long-step-s", type=float, default=2.0, help="0: the window as before")
    args = ap.parse_args()
    plain = steps(contextlib.nullcontext(), args.length, args.steps)
    with tempfile.TemporaryDirectory() as out:
        block = ampdiag.diagnose(
            out=out,
            report=False,
            tensorboard=False,
            console=False,
            profile_long_step_s=args.long_step_s,
        )
        inside = steps(block, args.length, args.steps)
        t0 = time.perf_counter()
        if args.profile_exit:
            prof = cProfile.Profile()
            prof.runcall(block.__exit__, None, None, None)
            prof.dump_stats(args.profile_exit)
        else:
            block.__exit__(None, None, None)
        exit_s = time.perf_counter() - t0
        warns = [w for w in block.run.warnings if "recorded" in w] if block.run else []
    print(f"plain {plain:.1f} s  block {inside:.1f} s  exit {exit_s:.1f} s  {warns}")


if __name__ == "__main__":
    main()
