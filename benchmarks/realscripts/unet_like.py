"""A diffusion UNet trained the way denoising-diffusion-pytorch's ``Trainer`` does (written here).

What makes it costly to diagnose, and what ``accelerate_ema_like.py`` lacks: a model of many
leaf modules (about 150: residual blocks of conv, RMS norm, SiLU and dropout with a time MLP,
linear and full attention through ``einsum``, down- and up-sampling) whose loss is computed
inside the root module (a diffusion wrapper drawing the time steps and the noise), trained
under ``Accelerator(mixed_precision="bf16")`` -- on a CPU without native BF16 an emulated
precision, several times slower than FP32 -- with ``--accum`` micro-batches a step, clipping,
Adam and an EMA copy updated every step.

    python unet_like.py [--steps 20] [--accum 2] [--dim 16]

Prints ``BLOCK_START``/``LOOP_START``/``STEP i``/``BLOCK_END <time.time()> <process CPU>``
and a digest of the model's and the EMA's weights.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
import time

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn


class RMSNorm(nn.Module):
    """Channel-wise RMS norm with a learned gain (a parameter, so one more leaf)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(1, ch, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) * self.gain * x.shape[1] ** 0.5


class TimeEmbedding(nn.Module):
    """Sinusoidal features of the time step."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freq = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        angle = t[:, None].float() * freq[None]
        return torch.cat((angle.sin(), angle.cos()), dim=-1)


class ConvNormAct(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = RMSNorm(cout)
        self.act = nn.SiLU()
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, scale_shift: tuple[torch.Tensor, ...] | None = None):
        x = self.norm(self.conv(x))
        if scale_shift is not None:
            scale, shift = scale_shift
            x = x * (scale + 1) + shift
        return self.drop(self.act(x))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.time = nn.Sequential(nn.SiLU(), nn.Linear(tdim, 2 * cout))
        self.first = ConvNormAct(cin, cout)
        self.second = ConvNormAct(cout, cout)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale_shift = self.time(temb)[:, :, None, None].chunk(2, dim=1)
        return self.second(self.first(x, scale_shift)) + self.skip(x)


class LinearAttention(nn.Module):
    def __init__(self, ch: int, heads: int = 4, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.scale = heads, head_dim**-0.5
        self.norm = RMSNorm(ch)
        self.qkv = nn.Conv2d(ch, 3 * heads * head_dim, 1, bias=False)
        self.out = nn.Sequential(nn.Conv2d(heads * head_dim, ch, 1), RMSNorm(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        q, k, v = (t.reshape(b, self.heads, -1, h * w) for t in self.qkv(self.norm(x)).chunk(3, 1))
        q, k = q.softmax(dim=-2) * self.scale, k.softmax(dim=-1)
        context = torch.einsum("bhdn,bhen->bhde", k, v)
        out = torch.einsum("bhde,bhdn->bhen", context, q)
        return self.out(out.reshape(b, -1, h, w)) + x


class Attention(nn.Module):
    def __init__(self, ch: int, heads: int = 4, head_dim: int = 32) -> None:
        super().__init__()
        self.heads, self.scale = heads, head_dim**-0.5
        self.norm = RMSNorm(ch)
        self.qkv = nn.Conv2d(ch, 3 * heads * head_dim, 1, bias=False)
        self.drop = nn.Dropout(0.0)
        self.out = nn.Conv2d(heads * head_dim, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        q, k, v = (t.reshape(b, self.heads, -1, h * w) for t in self.qkv(self.norm(x)).chunk(3, 1))
        sim = torch.einsum("bhdi,bhdj->bhij", q * self.scale, k)
        attn = self.drop(sim.softmax(dim=-1))
        out = torch.einsum("bhij,bhdj->bhdi", attn, v)
        return self.out(out.reshape(b, -1, h, w)) + x


class Down(nn.Module):
    """Space to depth (2x2 pixels into channels), then a 1x1 conv."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4 * cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pixel_unshuffle(x, 2))


class UNet(nn.Module):
    def __init__(self, dim: int = 16, mults: tuple[int, ...] = (1, 2)) -> None:
        super().__init__()
        tdim = 4 * dim
        self.init = nn.Conv2d(3, dim, 7, padding=3)
        self.time = nn.Sequential(TimeEmbedding(dim), nn.Linear(dim, tdim), nn.GELU(),
                                  nn.Linear(tdim, tdim))  # fmt: skip
        chans = [dim * m for m in mults]
        self.downs = nn.ModuleList()
        cin = dim
        for i, ch in enumerate(chans):
            last = i == len(chans) - 1
            attn = Attention(cin) if last else LinearAttention(cin)
            self.downs.append(nn.ModuleList([
                ResBlock(cin, cin, tdim), ResBlock(cin, cin, tdim), attn,
                nn.Conv2d(cin, ch, 3, padding=1) if last else Down(cin, ch),
            ]))  # fmt: skip
            cin = ch
        self.mid1, self.mid_attn, self.mid2 = (ResBlock(cin, cin, tdim), Attention(cin),
                                               ResBlock(cin, cin, tdim))  # fmt: skip
        self.ups = nn.ModuleList()
        for i, ch in enumerate(reversed([dim, *chans[:-1]])):
            last = i == len(chans) - 1
            skip = ch
            attn = LinearAttention(cin) if last else Attention(cin)
            conv = nn.Conv2d(cin, ch, 3, padding=1)
            up = conv if last else nn.Sequential(nn.Upsample(scale_factor=2), conv)
            self.ups.append(nn.ModuleList([
                ResBlock(cin + skip, cin, tdim), ResBlock(cin + skip, cin, tdim), attn, up,
            ]))  # fmt: skip
            cin = ch
        self.final = ResBlock(2 * dim, dim, tdim)
        self.out = nn.Conv2d(dim, 3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = self.init(x)
        first = x.clone()
        temb = self.time(t)
        skips = []
        for block1, block2, attn, down in self.downs:
            x = block1(x, temb)
            skips.append(x)
            x = attn(block2(x, temb))
            skips.append(x)
            x = down(x)
        x = self.mid2(self.mid_attn(self.mid1(x, temb)), temb)
        for block1, block2, attn, up in self.ups:
            x = block1(torch.cat((x, skips.pop()), dim=1), temb)
            x = attn(block2(torch.cat((x, skips.pop()), dim=1), temb))
            x = up(x)
        return self.out(self.final(torch.cat((x, first), dim=1), temb))


class Diffusion(nn.Module):
    """The root module: draws a time step and noise per image, returns the denoising loss."""

    def __init__(self, net: nn.Module, steps: int = 100) -> None:
        super().__init__()
        self.net, self.steps = net, steps
        betas = torch.linspace(1e-4, 0.02, steps)
        self.register_buffer("alphas_bar", torch.cumprod(1 - betas, dim=0))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        t = torch.randint(0, self.steps, (x0.shape[0],), device=x0.device)
        noise = torch.randn_like(x0)
        a = self.alphas_bar[t][:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(self.net(xt, t), noise)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args()
    print(f"BLOCK_START {time.time():.6f}", flush=True)
    torch.manual_seed(0)
    images = torch.rand(100, 3, 8, 8) * 2 - 1
    acc = Accelerator(mixed_precision="bf16", cpu=True)
    model = Diffusion(UNet(args.dim))
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=8e-5, betas=(0.9, 0.99))
    model, opt = acc.prepare(model, opt)
    print(f"LOOP_START {time.time():.6f}", flush=True)
    for step in range(args.steps):
        total = 0.0
        for _ in range(args.accum):
            x0 = images[torch.randint(len(images), (args.batch,))]
            with acc.autocast():
                loss = model(x0) / args.accum
            total += loss.item()
            acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), acc.unwrap_model(model).parameters(), strict=True):
                pe.lerp_(pm, 1 - 0.995)
        print(f"STEP {step} {time.time():.6f} loss {total:.6f}", flush=True)
    weights = [*acc.unwrap_model(model).parameters(), *ema.parameters()]
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in weights))
    print(f"DIGEST {digest.hexdigest()[:16]}")
    print(f"BLOCK_END {time.time():.6f} {time.process_time():.6f}", flush=True)


if __name__ == "__main__":
    main()
