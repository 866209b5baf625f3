"""A training loop in the style of an Accelerate trainer with an EMA copy (written here).

Like denoising-diffusion-pytorch's ``Trainer`` in shape, not its code: ``Accelerator(
mixed_precision="bf16")`` prepares a small conv denoiser and Adam; each step runs
``--accum`` micro-batches under ``accelerator.autocast()`` with the loss divided by the
count, ``accelerator.backward``, ``clip_grad_norm_``, ``opt.step()``, ``zero_grad``, then an
EMA copy (``copy.deepcopy`` of the model, updated by ``lerp_`` under ``no_grad``) every step.

    python accelerate_ema_like.py [--steps 20] [--accum 2]

Prints ``BLOCK_START``/``LOOP_START``/``STEP i``/``BLOCK_END <time.time()> <process CPU>``
and a digest of the EMA weights, so a caller can time the first and later steps and check
bit-identity.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import time

import torch
from accelerate import Accelerator
from torch import nn


class Denoiser(nn.Module):
    """A small conv encoder-decoder that predicts the noise added to a 16x16 image."""

    def __init__(self, ch: int = 16) -> None:
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(3, ch, 3, padding=1),
            nn.GroupNorm(8, ch),
            nn.SiLU(),
            nn.Conv2d(ch, 2 * ch, 4, stride=2, padding=1),
            nn.GroupNorm(8, 2 * ch),
            nn.SiLU(),
        )
        self.time = nn.Sequential(nn.Linear(1, 2 * ch), nn.SiLU(), nn.Linear(2 * ch, 2 * ch))
        self.up = nn.Sequential(
            nn.ConvTranspose2d(2 * ch, ch, 4, stride=2, padding=1),
            nn.GroupNorm(8, ch),
            nn.SiLU(),
            nn.Conv2d(ch, 3, 3, padding=1),
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.down(x) + self.time(t[:, None])[:, :, None, None]
        return self.up(h)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    print(f"BLOCK_START {time.time():.6f}", flush=True)
    torch.manual_seed(0)
    images = torch.rand(256, 3, 16, 16) * 2 - 1
    acc = Accelerator(mixed_precision="bf16", cpu=True)
    model = Denoiser()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.9, 0.99))
    model, opt = acc.prepare(model, opt)
    print(f"LOOP_START {time.time():.6f}", flush=True)
    for step in range(args.steps):
        total = 0.0
        for _ in range(args.accum):
            idx = torch.randint(len(images), (args.batch,))
            x0 = images[idx]
            t = torch.rand(args.batch)
            noise = torch.randn_like(x0)
            xt = (1 - t)[:, None, None, None].sqrt() * x0 + t[:, None, None, None].sqrt() * noise
            with acc.autocast():
                loss = nn.functional.mse_loss(model(xt, t), noise) / args.accum
            total += loss.item()
            acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), acc.unwrap_model(model).parameters(), strict=True):
                pe.lerp_(pm, 1 - 0.995)
        print(f"STEP {step} {time.time():.6f} loss {total:.6f}", flush=True)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in ema.parameters()))
    print(f"DIGEST {digest.hexdigest()[:16]}")
    print(f"BLOCK_END {time.time():.6f} {time.process_time():.6f}", flush=True)


if __name__ == "__main__":
    main()
