"""Overhead of diagnose() in a Lightning run against the same overhead in a plain loop.

The demo model (TinyGPT) is trained ``--steps`` steps in bf16 autocast on the CPU, two ways:
a plain PyTorch loop, and ``lightning.Trainer(precision="bf16-mixed")`` (Adam, a closure
optimizer: forward and backward inside ``optimizer.step``). Each way runs with and without
``ampdiag.diagnose()`` (default settings; report, TensorBoard and console off: they run at
exit, once), alternating, ``--rounds`` times. Timed: the steps after ``--skip`` (past the
profiled, audited and densely sampled first steps: the steady state a long run lives in),
from per-step timestamps taken the same way with and without ampdiag. Prints the median
times and the overhead ratio of each way; the claim is that they are the same.

    python benchmarks/bench_frameworks.py [--steps 72] [--skip 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
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
from ampdiag.demo import GPTConfig, TinyGPT, synthetic_batches

QUIET: dict[str, Any] = {"report": False, "tensorboard": False, "console": False}


def _plain(data: list[Any], stamps: list[float]) -> None:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        stamps.append(time.perf_counter())


def _lightning(data: list[Any], stamps: list[float]) -> None:
    import lightning as L

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = TinyGPT(GPTConfig())

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.model(x).float().flatten(0, 1), y.flatten())

        def on_train_batch_end(self, *args: Any) -> None:
            stamps.append(time.perf_counter())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        max_steps=len(data),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))


def _timed(way: Any, data: list[Any], skip: int, diagnosed: bool) -> float:
    stamps: list[float] = []
    if diagnosed:
        with tempfile.TemporaryDirectory() as tmp, ampdiag.diagnose(out=tmp, **QUIET):
            way(data, stamps)
    else:
        way(data, stamps)
    return (stamps[-1] - stamps[skip - 1]) / (len(stamps) - skip)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=72)
    ap.add_argument("--skip", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = synthetic_batches(GPTConfig(), 8, args.steps, torch.device("cpu"))
    for name, way in (("plain loop", _plain), ("lightning", _lightning)):
        base: list[float] = []
        ours: list[float] = []
        _timed(way, data, args.skip, diagnosed=False)  # warm-up: imports, kernels, caches
        for _ in range(args.rounds):
            base.append(_timed(way, data, args.skip, diagnosed=False))
            ours.append(_timed(way, data, args.skip, diagnosed=True))
        b, o = statistics.median(base), statistics.median(ours)
        print(
            f"{name}: {b * 1000:.2f} ms/step plain, {o * 1000:.2f} ms/step under diagnose(), "
            f"overhead {o / b:.3f}x (median of {args.rounds}; per round "
            + ", ".join(f"{x / y:.3f}" for x, y in zip(ours, base, strict=True))
            + ")"
        )


if __name__ == "__main__":
    main()
