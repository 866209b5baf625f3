"""A training script in the style of nanoGPT's ``train.py`` (written here, not nanoGPT's code).

A flat loop over ``iter_num`` with ``get_batch`` sampling random windows, ``ctx = autocast``
(bf16 on the CPU), a GradScaler enabled only for fp16, gradient accumulation over
``--accum`` micro-steps with the loss divided by it, clipping after ``scaler.unscale_``, and
``estimate_loss()`` under ``no_grad`` with ``model.eval()`` every ``--eval-every`` iterations.

    python nanogpt_like.py [--iters 20] [--accum 2] [--eval-every 10] [--eval-iters 5]

Prints ``BLOCK_START <t>`` and ``BLOCK_END <t>`` (time.time()), as mingpt_like.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from tinygpt import GPT, CharData


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-iters", type=int, default=5)
    args = p.parse_args()
    print(f"BLOCK_START {time.time():.6f}", flush=True)
    torch.manual_seed(1337)
    data = CharData().data
    block, batch = 32, 12

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i : i + block] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
        return x, y

    model = GPT(block=block)
    dtype = torch.bfloat16
    ctx = torch.autocast("cpu", dtype=dtype)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            x, y = get_batch()
            with ctx:
                _, loss = model(x, y)
            assert loss is not None
            losses[k] = loss.item()
        model.train()
        return float(losses.mean())

    x, y = get_batch()
    loss = torch.tensor(0.0)
    for iter_num in range(args.iters):
        if iter_num % args.eval_every == 0:
            print(f"step {iter_num}: val loss {estimate_loss():.4f}")
        for _ in range(args.accum):
            with ctx:
                _, loss = model(x, y)
                assert loss is not None
                loss = loss / args.accum
            x, y = get_batch()
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    print(f"final loss {loss.item() * args.accum:.6f}")
    print(f"BLOCK_END {time.time():.6f} {time.process_time():.6f}", flush=True)


if __name__ == "__main__":
    main()
