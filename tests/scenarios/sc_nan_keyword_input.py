"""A Hugging Face-style model, called with keywords throughout, makes an inf in a layer's own
code at step 2 of 6 (FP32), and hands it on by keyword.

The model is called ``model(input_ids=..., labels=...)``; it calls its layer
``layer(hidden_states=..., attention_mask=...)``, and the layer calls its attention
``attn(position_bias=causal, attention_mask=mask, hidden_states=h)``: the mask and the
position bias, both additive, hold -inf by design (the bias under a name no mask has; the
attention's output stays finite). At step 2 the layer multiplies the output of its LayerNorm
by inf (the injection), between its child ``ln`` (finite output) and its child ``attn``,
which receives the inf only as a keyword argument. torch's global forward pre-hook gets no
keyword arguments, so a sentinel reading positional inputs alone sees the inf first as the
input of ``attn.q_proj`` and names ``attn``'s own code. The origin must name the layer,
between ``ln`` and ``attn``. The -inf of the mask and the bias is theirs, not a divergence:
no other step may be non-finite.

Truth, recorded at the injection without ampdiag: the layer checks that its LayerNorm's output
is finite and what it passes to ``attn`` is not, and records the step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import nan_origin
from tests.scenarios.divergence import origin_fix_fits
from tests.scenarios.harness import Expect, Scenario, Truth

AT = 2


class Attention(nn.Module):
    """Single-head causal self-attention taking its inputs by keyword only."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.o_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(
        self,
        *,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        position_bias: torch.Tensor,
    ) -> Any:
        q, k = self.q_proj(hidden_states), self.k_proj(hidden_states)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores + attention_mask + position_bias
        return self.o_proj(scores.softmax(-1) @ self.v_proj(hidden_states))


class Layer(nan_origin.Injecting):  # fired: steps at which its own code made the inf
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = Attention(dim)

    def forward(self, *, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        h = self.ln(hidden_states)
        if self.now == AT:  # the injection, in the layer's own code
            made = h * float("inf")
            if bool(torch.isfinite(h).all()) and not bool(torch.isfinite(made).all()):
                self.fired.append(self.now)
            h = made
        # the -inf ones first: a keyword's position says nothing of its role
        causal = torch.full_like(attention_mask, float("-inf")).triu(1)
        out = self.attn(position_bias=causal, attention_mask=attention_mask, hidden_states=h)
        return hidden_states + out


def run(out: Path) -> tuple[Session, Truth]:
    bad_loss: list[int] = []

    def watch(step: int, loss: torch.Tensor) -> None:
        if not bool(torch.isfinite(loss)):
            bad_loss.append(step)

    r = nan_origin.train(out, Layer, masked=True, before_backward=watch)
    layer, names = r.one(Layer), r.names
    # the divergence replay runs the step's forward again: the same step, once more
    assert set(layer.fired) == {AT}, layer.fired
    between = [names[layer.ln], names[layer.attn]]
    measured = {
        "first_step": layer.fired[0],
        "module": names[layer],
        "between": between,
        "loss_nonfinite_steps": bad_loss,
    }
    expect = Expect(
        "nonfinite-origin",
        module=names[layer],
        step=layer.fired[0],
        evidence={
            "phase": ("forward", 0.0),
            "parent_code": (True, 0.0),
            "between": (between, 0.0),
        },
    )
    session = r.session

    def diverged_guards_the_layer(s: Session) -> str | None:
        # the lead fix (nonfinite-origin is merged under it) guards the op where it was made,
        # not in a child the inf only passed through
        found = [f for f in s.all_findings() if f.id == "diverged"]
        if not found:
            return "no diverged finding"
        fix = found[0].fix
        if f"op in {names[layer]}:" not in fix or names[layer.attn] in fix:
            return f"diverged's fix does not guard {names[layer]}: {fix!r}"
        return None

    truth = Truth(expect=[expect], measured=measured)
    truth.checks["diverged"] = diverged_guards_the_layer
    truth.checks["origin-fix-fits"] = origin_fix_fits(lr=False)  # the run computes in FP32
    return session, truth


SCENARIO = Scenario(
    "nan-keyword-input",
    "A layer's own code makes an inf at step 2 of 6 and passes it to its child by keyword "
    "(HF-style keyword calls, a -inf causal mask; FP32).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
