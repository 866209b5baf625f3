"""Shared pieces of the NaN-origin scenarios that make the fault in a module's own code: an op
whose backward turns the gradient NaN at one step, and a Hugging Face-style model called by
keyword throughout (``sc_nan_keyword_*``) with its training loop.

What each scenario injects, and the truth it records there, stays in its own file; this module
holds only what they all build the same way, so the runs stay bit for bit the ones each file
wrote out before (the same modules created in the same order under the same seed, the same
data, the same optimizer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios.harness import diagnose, seeded, session_of

STEPS, VOCAB, DIM, TOKENS = 6, 50, 32, 8

M = TypeVar("M", bound=nn.Module)


class Injecting(nn.Module):
    """A module that injects a fault at one step: the loop sets ``now`` (the step); ``fired``
    records the steps at which its injection really made a non-finite value (the truth)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = -1
        self.fired: list[int] = []


class NaNGrad(torch.autograd.Function):
    """Identity in the forward; at step ``at`` of ``owner`` the backward returns the gradient
    times NaN, and records the step in ``owner.fired`` if the gradient it received was finite
    and the one it returns is not."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, owner: Injecting, at: int) -> torch.Tensor:
        ctx.owner, ctx.at = owner, at
        return h.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        owner = ctx.owner
        if owner.now == ctx.at:
            out = grad * float("nan")
            if bool(torch.isfinite(grad).all()) and not bool(torch.isfinite(out).all()):
                owner.fired.append(owner.now)
            return out, None, None
        return grad, None, None


class Layer(nn.Module):
    """A pre-norm residual layer, ``hidden_states + attn(hidden_states=ln(hidden_states))``,
    passing the attention mask on by keyword (before ``hidden_states``) when given one."""

    def __init__(self, dim: int, attention: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = attention(dim)

    def forward(
        self, *, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> Any:
        if attention_mask is None:
            return hidden_states + self.attn(hidden_states=self.ln(hidden_states))
        h = self.ln(hidden_states)
        return hidden_states + self.attn(attention_mask=attention_mask, hidden_states=h)


class Model(nn.Module):
    """Embedding, one layer, head: called ``model(input_ids=..., labels=...)`` and returning a
    dict with the loss, as a Hugging Face model is. ``masked``: it calls its layer with a -inf
    causal mask (``attention_mask=``, -inf above the diagonal by design)."""

    def __init__(self, layer: Callable[[int], nn.Module], *, masked: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer = layer(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.masked = masked

    def forward(self, *, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        if self.masked:
            t = input_ids.shape[1]
            mask = torch.full((t, t), float("-inf")).triu(1)  # -inf above the diagonal, by design
            h = self.layer(hidden_states=self.embed(input_ids), attention_mask=mask)
        else:
            h = self.layer(hidden_states=self.embed(input_ids))
        logits = self.head(h)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


@dataclass
class Run:
    """A finished keyword run: its session, the trained model and its modules' names."""

    session: Session
    model: Model
    names: dict[nn.Module, str]

    def one(self, kind: type[M]) -> M:
        """The model's module of class ``kind`` (the first, in ``modules()`` order)."""
        return next(m for m in self.model.modules() if isinstance(m, kind))


def train(
    out: Path,
    layer: Callable[[int], nn.Module],
    *,
    masked: bool,
    before_backward: Callable[[int, torch.Tensor], None] | None = None,
) -> Run:
    """Builds `Model` with ``layer`` (seeded 0) and trains it `STEPS` steps of SGD on random
    tokens under ``diagnose(out)``, setting ``now`` of every `Injecting` module to the step
    before its forward; ``before_backward(step, loss)`` may watch each loss."""
    with seeded(0):
        model = Model(layer, masked=masked)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        data = [torch.randint(0, VOCAB, (8, TOKENS + 1), generator=g) for _ in range(STEPS)]
        names = {m: n for n, m in model.named_modules()}
        injecting = [m for m in model.modules() if isinstance(m, Injecting)]
        with diagnose(out) as d:
            for step, ids in enumerate(data):
                for m in injecting:
                    m.now = step
                opt.zero_grad(set_to_none=True)
                loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:])["loss"]
                if before_backward is not None:
                    before_backward(step, loss)
                loss.backward()
                opt.step()
    return Run(session_of(d), model, names)
