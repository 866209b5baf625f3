"""The embedded workloads: a small GPT-style transformer on synthetic tokens.

``ampdiag demo`` trains it under ``ampdiag.diagnose()`` (CUDA when present, else CPU) and
writes reports/demo/. Two scenarios:

* ``underflow`` (the default): FP16 autocast *without* a GradScaler, as a first mixed-precision
  attempt often is. The gradients of a language model's loss are small (about 1/(tokens x
  vocabulary) at the head), and FP16 flushes most of them, so the report shows what ampdiag is
  for: the modules that lose their gradients, the loss scale that would keep them, and the
  precision A/B measured on the model. The model is small and the run long enough that the
  A/B fits its budget (5% of the block) on a CPU.
* ``amp``: the same model trained a few steps under ``--dtype`` autocast, with a GradScaler in
  FP16 (a correct setup).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    """Size of the demo model (tiny by default: it must train in seconds on 2 CPU cores)."""

    vocab: int = 512
    seq: int = 64
    dim: int = 128
    heads: int = 4
    layers: int = 2


UNDERFLOW_CONFIG = GPTConfig(vocab=512, seq=32, dim=64, heads=4, layers=2)
"""The ``underflow`` scenario's model: small enough that the A/B fits its budget on a CPU."""
SCENARIOS = ("underflow", "amp")
DEFAULT_STEPS = {"underflow": 100, "amp": 8}


class Attention(nn.Module):
    """Causal multi-head self-attention, written out (softmax visible to autocast)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.mask: torch.Tensor
        mask = torch.tril(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attends each position to itself and the positions before it."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)  # type: ignore[no-any-return]


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Applies attention and the MLP, each with a residual."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # type: ignore[no-any-return]


class TinyGPT(nn.Module):
    """A GPT-style language model: embeddings, blocks, final norm, tied-free head."""

    def __init__(self, cfg: GPTConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GPTConfig()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Returns next-token logits for token ids of shape (batch, seq)."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # type: ignore[no-any-return]


def synthetic_batches(
    cfg: GPTConfig, batch: int, steps: int, device: torch.device, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random token sequences and their next-token targets (reproducible)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=gen)
        out.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))
    return out


def default_device() -> torch.device:
    """CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_demo(
    out: str | Path = "reports/demo",
    *,
    scenario: str = "underflow",
    device: str | None = None,
    dtype: str = "float16",
    steps: int | None = None,
    batch: int = 8,
    seed: int = 0,
) -> Path:
    """Trains TinyGPT under autocast inside diagnose() and returns the report's folder.

    Args:
        out: Output folder.
        scenario: "underflow" (FP16 without a GradScaler; ``dtype`` must be "float16") or
            "amp" (``dtype`` autocast, with a GradScaler in FP16).
        device: "cuda" or "cpu" (default: CUDA when present).
        dtype: Autocast dtype: "float16", "bfloat16", or "float32" (off).
        steps: Training steps (default: 100 for "underflow", 8 for "amp").
        batch: Sequences per batch.
        seed: Seed for the weights and the data.

    Raises:
        ValueError: An unknown scenario, or a dtype the scenario does not train in.
    """
    import ampdiag

    if scenario not in SCENARIOS:
        raise ValueError(f"unknown demo scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    if scenario == "underflow" and dtype != "float16":
        raise ValueError("the underflow demo trains in float16; use --scenario amp for --dtype")
    dev = torch.device(device) if device else default_device()
    torch.manual_seed(seed)
    cfg = UNDERFLOW_CONFIG if scenario == "underflow" else GPTConfig()
    model = TinyGPT(cfg).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    amp_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    use_scaler = scenario == "amp" and amp_dtype is torch.float16
    scaler = torch.amp.GradScaler(dev.type, enabled=use_scaler)
    data = synthetic_batches(cfg, batch, steps or DEFAULT_STEPS[scenario], dev, seed)
    with ampdiag.diagnose(out=out) as d:
        for x, y in data:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(
                dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None
            ):
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, cfg.vocab), y.reshape(-1))
            if use_scaler:
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
    return d.out
