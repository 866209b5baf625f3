"""An attention module given a -inf causal mask by keyword makes an inf in its own computation
at step 2 of 6 (FP32).

The layer calls ``attn(attention_mask=mask, hidden_states=h)``; ``attn`` computes its
projections with its own weights (no child module) and, at step 2, multiplies its scores by
inf (the injection). Its input ``h`` is finite, its output is not: the origin is ``attn``'s
output. The mask holds -inf by design and reaches ``attn`` before ``h``; read as ``attn``'s
input, it would make the inf look as if it came in from the layer's own code, before
``attn``. An argument named like a mask is not an input the origin reads.

Truth, recorded at the injection without ampdiag: the attention checks that its input is
finite and its scores are not, and records the step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

AT, STEPS, VOCAB, DIM, TOKENS = 2, 6, 50, 32, 8


class Attention(nn.Module):
    """Single-head causal self-attention with its own weights, inputs by keyword only."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(dim, dim) / dim**0.5) for _ in "qkv")
        self.now = -1
        self.fired: list[int] = []

    def forward(self, *, attention_mask: torch.Tensor, hidden_states: torch.Tensor) -> Any:
        q, k = hidden_states @ self.wq, hidden_states @ self.wk
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.now == AT:  # the injection, in its own computation
            made = scores * float("inf")
            if bool(torch.isfinite(hidden_states).all()) and not bool(torch.isfinite(made).all()):
                self.fired.append(self.now)
            scores = made
        return (scores + attention_mask).softmax(-1) @ (hidden_states @ self.wv)


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = Attention(dim)

    def forward(self, *, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        h = self.ln(hidden_states)
        return hidden_states + self.attn(attention_mask=attention_mask, hidden_states=h)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer = Layer(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, *, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        t = input_ids.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)  # -inf above the diagonal, by design
        h = self.layer(hidden_states=self.embed(input_ids), attention_mask=mask)
        logits = self.head(h)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


def run(out: Path) -> tuple[Session, Truth]:
    with seeded(0):
        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        data = [torch.randint(0, VOCAB, (8, TOKENS + 1), generator=g) for _ in range(STEPS)]
        names = {m: n for n, m in model.named_modules()}
        attn = model.layer.attn
        with diagnose(out) as d:
            for step, ids in enumerate(data):
                attn.now = step
                opt.zero_grad(set_to_none=True)
                model(input_ids=ids[:, :-1], labels=ids[:, 1:])["loss"].backward()
                opt.step()
    # the divergence replay runs the step's forward again: the same step, once more
    assert set(attn.fired) == {AT}, attn.fired
    measured = {"first_step": attn.fired[0], "module": names[attn]}
    expect = Expect(
        "nonfinite-origin",
        module=names[attn],
        step=attn.fired[0],
        evidence={"phase": ("forward", 0.0), "parent_code": (False, 0.0)},
    )
    return session_of(d), Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-keyword-mask",
    "An attention given a -inf mask by keyword makes an inf in its own computation at step 2 "
    "of 6 (FP32): the mask is not its input.",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
