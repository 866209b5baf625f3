"""A training script in the style of minGPT's trainer (written here, not minGPT's code).

A Trainer class with an ``on_batch_end`` callback list, a DataLoader with workers over a
random sampler with replacement, ``zero_grad(set_to_none=True)``, gradient clipping, AdamW,
and a callback that every ``--gen-every`` iterations puts the model in eval mode and generates
``--gen-tokens`` tokens under ``no_grad`` (minGPT's char/adder demos do this).

    python mingpt_like.py [--iters 30] [--gen-every 10] [--gen-tokens 200] [--workers 2]

Prints ``BLOCK_START <t>`` and ``BLOCK_END <t>`` (time.time()) so a caller can tell the
script's own time from what comes after it (ampdiag's exit).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from tinygpt import GPT, CharData


class Trainer:
    def __init__(self, model: GPT, dataset: CharData, iters: int, workers: int) -> None:
        self.model = model
        self.dataset = dataset
        self.iters = iters
        self.workers = workers
        self.callbacks: dict[str, list[Callable[[Trainer], None]]] = {}
        self.iter_num = 0
        self.loss = torch.tensor(0.0)

    def add_callback(self, event: str, fn: Callable[[Trainer], None]) -> None:
        self.callbacks.setdefault(event, []).append(fn)

    def trigger(self, event: str) -> None:
        for fn in self.callbacks.get(event, []):
            fn(self)

    def run(self) -> None:
        model = self.model
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
        loader = torch.utils.data.DataLoader(
            self.dataset,
            sampler=torch.utils.data.RandomSampler(
                self.dataset, replacement=True, num_samples=10**6
            ),
            shuffle=False,
            pin_memory=False,
            batch_size=16,
            num_workers=self.workers,
        )
        model.train()
        it = iter(loader)
        while True:
            x, y = next(it)
            _, loss = model(x, y)
            assert loss is not None
            self.loss = loss
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            self.trigger("on_batch_end")
            self.iter_num += 1
            if self.iter_num >= self.iters:
                break


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--gen-every", type=int, default=10)
    p.add_argument("--gen-tokens", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    print(f"BLOCK_START {time.time():.6f}", flush=True)
    torch.manual_seed(0)
    model = GPT()
    trainer = Trainer(model, CharData(), args.iters, args.workers)

    def batch_end(t: Trainer) -> None:
        if t.iter_num % args.gen_every == 0:
            t.model.eval()
            with torch.no_grad():
                out = t.model.generate(torch.zeros(1, 1, dtype=torch.long), args.gen_tokens)
            print(f"iter {t.iter_num} loss {t.loss.item():.4f} sample {out[0, -5:].tolist()}")
            t.model.train()

    trainer.add_callback("on_batch_end", batch_end)
    trainer.run()
    print(f"final loss {trainer.loss.item():.6f}")
    print(f"BLOCK_END {time.time():.6f} {time.process_time():.6f}", flush=True)


if __name__ == "__main__":
    main()
