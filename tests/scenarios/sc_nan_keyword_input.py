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
from tests.scenarios.divergence import origin_fix_fits
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, seeded, session_of

AT, STEPS, VOCAB, DIM, TOKENS = 2, 6, 50, 32, 8


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


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.now = -1
        self.fired: list[int] = []  # steps at which its own code made the inf

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
        layer = model.layer
        bad_loss: list[int] = []
        with diagnose(out) as d:
            for step, ids in enumerate(data):
                layer.now = step
                opt.zero_grad(set_to_none=True)
                loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:])["loss"]
                if not bool(torch.isfinite(loss)):
                    bad_loss.append(step)
                loss.backward()
                opt.step()
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
    session = session_of(d)

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
