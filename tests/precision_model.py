"""A small model with every kind of op the precision audit must explain (shared by tests)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


@torch.library.custom_op("ampdiag_test::mix", mutates_args=())
def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A custom op whose body autocast must see: a matmul plus a tanh."""
    return torch.tanh(a @ b)


@torch.library.custom_op("ampdiag_test::halve", mutates_args=())
def halve(a: torch.Tensor) -> torch.Tensor:
    """A custom op autocast knows nothing about: it runs in its input's dtype."""
    return a * 0.5


halve.register_autograd(lambda ctx, grad: grad * 0.5)


def _mix_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    a, b = inputs
    ctx.save_for_backward(a, b, output)


def _mix_backward(ctx, grad):  # type: ignore[no-untyped-def]
    a, b, out = ctx.saved_tensors
    g = grad * (1 - out * out)
    g = g.to(out.dtype)
    return g @ b.to(g.dtype).transpose(-2, -1), a.to(g.dtype).transpose(-2, -1) @ g


mix.register_autograd(_mix_backward, setup_context=_mix_setup)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln(x))


class Stem(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        # A penalty autocast computes in FP32 (mse_loss is on CPU autocast's FP32 list).
        self.penalty = F.mse_loss(y, torch.zeros_like(y)).detach()
        return y


class Head(nn.Module):
    """A user head that casts to FP32 by hand: its log_softmax runs in FP32."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).float().log_softmax(dim=-1)


class AuditNet(nn.Module):
    """conv + batch norm stem, FP32 positional parameter, LayerNorm, attention, custom op,
    user .float() head."""

    def __init__(self, channels: int = 8, dim: int = 16, heads: int = 2, classes: int = 5) -> None:
        super().__init__()
        self.stem = Stem(channels)
        self.embed = nn.Linear(channels, dim)
        self.pos = nn.Parameter(torch.randn(16, dim) * 0.02)
        self.block = Block(dim, heads)
        self.mix_w = nn.Parameter(torch.randn(dim, dim) * 0.1)
        self.head = Head(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)  # (b, c, 4, 4)
        t = h.flatten(2).transpose(1, 2)  # (b, 16, c)
        z = self.embed(t) + self.pos  # bf16 + FP32 parameter -> FP32 (promotion)
        z = self.block(z)
        z = halve(z)  # unknown to autocast, FP32 input -> FP32
        z = mix(z, self.mix_w)  # custom op: autocast must reach its body
        return self.head(z.mean(dim=1))


def batch(seed: int = 0, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 4, 4, generator=g), torch.randint(0, 5, (n,), generator=g)


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, dtype: torch.dtype, seed: int
) -> torch.Tensor:
    x, y = batch(seed)
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
    loss = F.nll_loss(out, y)  # the loss outside the autocast block
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()
