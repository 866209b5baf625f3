"""Small models and one training loop the scenarios share (CPU, milliseconds per step).

Four architectures for the healthy controls and the faults: an MLP, a CNN, a small
transformer and an embedding + GRU model; and a nanoGPT-style GPT (causal self-attention with
its own q/k/v and output projections, as Karpathy's nanoGPT writes it) for the numerics of a
real language model. `make` builds one with its batch maker.
`train` runs the loop every scenario uses, with the knobs the faults need (autocast dtype,
a GradScaler, a loss multiplier, a hook per step), and is the same whether ampdiag watches
or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

Batch = tuple[torch.Tensor, torch.Tensor]


class MLP(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class CNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return self.head(self.pool(h).flatten(1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(self.embed(idx))))


class EmbedGRU(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(idx))
        return self.head(out[:, -1])


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab: int = 64, block: int = 16, dim: int = 48, heads: int = 4, layers: int = 2
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.h = nn.Sequential(*[GPTBlock(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.lm_head(self.ln_f(self.h(self.wte(idx) + self.wpe(pos))))


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for class outputs (B, C) and token outputs (B, T, V) alike."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


@dataclass
class Setup:
    """A model and its data: ``batch(generator)`` draws one batch."""

    model: nn.Module
    batch: Callable[[torch.Generator], Batch]


def make(arch: str, batch_size: int = 16) -> Setup:
    """One of "mlp", "cnn", "transformer", "gru", "gpt", "demo", seeded by the caller."""
    n = batch_size
    if arch == "mlp":
        return Setup(MLP(), lambda g: (torch.randn(n, 32, generator=g), _labels(g, n, 10)))
    if arch == "cnn":
        return Setup(CNN(), lambda g: (torch.randn(n, 3, 8, 8, generator=g), _labels(g, n, 10)))
    if arch == "transformer":
        return Setup(
            Transformer(),
            lambda g: (torch.randint(0, 50, (n, 12), generator=g), _labels(g, n * 12, 50)),
        )
    if arch == "gpt":
        return Setup(
            GPT(), lambda g: (torch.randint(0, 64, (n, 16), generator=g), _labels(g, n * 16, 64))
        )
    if arch == "demo":  # the model `ampdiag demo` trains (its underflow scenario)
        from ampdiag.demo import UNDERFLOW_CONFIG, TinyGPT

        cfg = UNDERFLOW_CONFIG
        return Setup(
            TinyGPT(cfg),
            lambda g: (
                torch.randint(0, cfg.vocab, (n, cfg.seq), generator=g),
                _labels(g, n * cfg.seq, cfg.vocab),
            ),
        )
    if arch == "gru":
        return Setup(
            EmbedGRU(), lambda g: (torch.randint(0, 50, (n, 12), generator=g), _labels(g, n, 5))
        )
    raise ValueError(arch)


def _labels(g: torch.Generator, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=g)


def batches(setup: Setup, steps: int, seed: int = 1) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [setup.batch(g) for _ in range(steps)]


def train(
    model: nn.Module,
    data: list[Batch],
    *,
    dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler | None = None,
    loss_mul: float = 1.0,
    lr: float = 0.05,
    optimizer: torch.optim.Optimizer | None = None,
    before_backward: Callable[[int, torch.Tensor, torch.Tensor, Batch], None] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_of,
    step_hook: Callable[[int], Any] | None = None,
    after_backward: Callable[[int], Any] | None = None,
) -> list[float]:
    """Trains ``model`` one step per batch; returns the losses.

    ``before_backward(step, out, loss, batch)`` sees each step's output and loss before the
    backward, ``after_backward(step)`` the gradients before the optimizer (a scenario
    measures its truth there). The loss is ``loss_fn(out, y) * loss_mul``
    computed in FP32 (``out.float()``), as a user would.
    """
    opt = optimizer if optimizer is not None else torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step, (x, y) in enumerate(data):
        if step_hook is not None:
            step_hook(step)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(x)
        loss = loss_fn(out.float(), y) * loss_mul
        if before_backward is not None:
            before_backward(step, out, loss, (x, y))
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if after_backward is not None:
            after_backward(step)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        losses.append(float(loss.detach()))
    return losses
