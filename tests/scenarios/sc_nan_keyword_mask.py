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
from tests.scenarios import nan_origin
from tests.scenarios.harness import Expect, Scenario, Truth

AT = 2


class Attention(nan_origin.Injecting):
    """Single-head causal self-attention with its own weights, inputs by keyword only."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(dim, dim) / dim**0.5) for _ in "qkv")

    def forward(self, *, attention_mask: torch.Tensor, hidden_states: torch.Tensor) -> Any:
        q, k = hidden_states @ self.wq, hidden_states @ self.wk
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.now == AT:  # the injection, in its own computation
            made = scores * float("inf")
            if bool(torch.isfinite(hidden_states).all()) and not bool(torch.isfinite(made).all()):
                self.fired.append(self.now)
            scores = made
        return (scores + attention_mask).softmax(-1) @ (hidden_states @ self.wv)


def run(out: Path) -> tuple[Session, Truth]:
    r = nan_origin.train(out, lambda dim: nan_origin.Layer(dim, Attention), masked=True)
    attn, names = r.one(Attention), r.names
    # the divergence replay runs the step's forward again: the same step, once more
    assert set(attn.fired) == {AT}, attn.fired
    measured = {"first_step": attn.fired[0], "module": names[attn]}
    expect = Expect(
        "nonfinite-origin",
        module=names[attn],
        step=attn.fired[0],
        evidence={"phase": ("forward", 0.0), "parent_code": (False, 0.0)},
    )
    return r.session, Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-keyword-mask",
    "An attention given a -inf mask by keyword makes an inf in its own computation at step 2 "
    "of 6 (FP32): the mask is not its input.",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
