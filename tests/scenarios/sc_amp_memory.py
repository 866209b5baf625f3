"""What autocast can shrink: activations that stay FP32 under autocast, and ones it halves.

Truth (`tests.scenarios.memory_truth.saved_bytes`, saved-tensor hooks, no ampdiag): the bytes
autograd saves for the backward under bf16 autocast and without it, at the probe's largest
batch (4); the model state by arithmetic.

* `amp-memory-not-reduced` for a model whose activations come from elementwise ops on its FP32
  input (a learned gate, sigmoid, tanh, GELU before one small linear layer: autocast casts only
  the matmul's input): the activation ratio low precision / FP32 within 0.05 of the measured
  one (>= 0.80).
* None for a CNN with wide activations: autocast halves them (measured ratio < 0.80), and the
  model state is under half the peak (bounded by the state over state + activations).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import ampdiag
from ampdiag.session import Session
from tests.scenarios import models
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, session_of
from tests.scenarios.memory_truth import saved_bytes

STEPS, BATCH, PROBED = 4, 32, 4


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


class Gate(nn.Module):
    """A learned elementwise scale of the input: FP32 in, FP32 out (autocast casts no ``mul``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _elementwise() -> nn.Module:
    return nn.Sequential(Gate(1024), nn.Sigmoid(), nn.Tanh(), nn.GELU(), nn.Linear(1024, 10))


def _wide_batch(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 1024, generator=g), torch.randint(0, 10, (n,), generator=g)


def _cnn_batch(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _runner(arch: str):
    def run(out: Path) -> tuple[Session, Truth]:
        torch.manual_seed(0)
        model = _elementwise() if arch == "elementwise" else _cnn()
        make = _wide_batch if arch == "elementwise" else _cnn_batch
        g = torch.Generator().manual_seed(1)
        data = [make(g, BATCH) for _ in range(STEPS)]
        x, y = data[0]
        low = saved_bytes(model, x[:PROBED], y[:PROBED], models.loss_of, torch.bfloat16)
        fp32 = saved_bytes(model, x[:PROBED], y[:PROBED], models.loss_of, None)
        ratio = low["activations"] / fp32["activations"]
        params = sum(4 * p.numel() for p in model.parameters())
        state = 3 * params  # weights, gradients, SGD momentum
        acts = saved_bytes(model, x, y, models.loss_of, torch.bfloat16)["activations"]
        measured = {"ratio": ratio, "state_bytes": state, "activation_bytes": acts}
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        with diagnose(out, speed_probe=False) as d:
            ampdiag.memory_probe(
                model, lambda n: (x[:n], y[:n]), loss_fn=models.loss_of,
                autocast_dtype=torch.bfloat16, batch_sizes=(2, PROBED),
            )  # fmt: skip
            for xb, yb in data:
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = models.loss_of(model(xb), yb)
                loss.backward()
                opt.step()
        if arch == "elementwise":
            assert ratio >= 0.80, measured
            expect = Expect(
                "amp-memory-not-reduced",
                evidence={"activation_ratio_low_vs_fp32": (ratio, 0.05)},
            )
            return session_of(d), Truth(expect=[expect], measured=measured)
        assert ratio < 0.80 and state / (params + acts) < 0.5, measured
        return session_of(d), Truth(forbid={"amp-memory-not-reduced"}, measured=measured)

    return run


SCENARIOS = [
    Scenario(
        "amp-memory-fp32-elementwise",
        "Elementwise ops on the FP32 input hold most activations: autocast barely shrinks them.",
        _runner("elementwise"),
    ),
    Scenario(
        "amp-memory-halved-cnn",
        "bf16 autocast halves a CNN's wide activations; the model state is small.",
        _runner("cnn"),
    ),
]
