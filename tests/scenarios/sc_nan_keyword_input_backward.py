"""A module called by keyword makes a NaN in its own backward at step 3 of 6 (FP32): the
gradient with respect to its keyword input.

The layer calls ``attn(hidden_states=h)``, ``h`` the output of its LayerNorm ``ln``. Inside,
``attn`` passes ``h`` through an op (identity in the forward) before its child ``proj``; at
step 3 the op's backward turns the gradient NaN. torch's global forward hook sees keyword
arguments only where asked to: a sentinel tracking positional inputs alone knows ``h`` only
as ``ln``'s output and names the layer's own code after ``ln``. The value is made in
``attn``'s own backward code, before its child ``proj``: the origin must name ``attn``.

Truth, recorded at the injection without ampdiag: the op's backward checks that the gradient
it received is finite and the one it returns is not, and records the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

AT, STEPS, VOCAB, DIM, TOKENS = 3, 6, 50, 32, 8


class _Op(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, attn: Attention) -> torch.Tensor:
        ctx.attn = attn
        return h.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        attn = ctx.attn
        if attn.now == AT:
            out = grad * float("nan")
            if bool(torch.isfinite(grad).all()) and not bool(torch.isfinite(out).all()):
                attn.fired.append(attn.now)
            return out, None
        return grad, None


class Attention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.now = -1
        self.fired: list[int] = []

    def forward(self, *, hidden_states: torch.Tensor) -> Any:
        return self.proj(_Op.apply(hidden_states, self))  # type: ignore[no-untyped-call]


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = Attention(dim)

    def forward(self, *, hidden_states: torch.Tensor) -> Any:
        return hidden_states + self.attn(hidden_states=self.ln(hidden_states))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer = Layer(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, *, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        logits = self.head(self.layer(hidden_states=self.embed(input_ids)))
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
    # the divergence replay runs the step's backward again: the same step, once more
    assert set(attn.fired) == {AT}, attn.fired
    between = [None, names[attn.proj]]
    measured = {"first_step": attn.fired[0], "module": names[attn], "between": between}
    expect = Expect(
        "nonfinite-origin",
        module=names[attn],
        step=attn.fired[0],
        evidence={
            "phase": ("backward", 0.0),
            "parent_code": (True, 0.0),
            "between": (between, 0.0),
        },
    )
    return session_of(d), Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-keyword-input-backward",
    "A module called by keyword makes NaN in its own backward (its keyword input's gradient) "
    "at step 3 of 6 (FP32).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
