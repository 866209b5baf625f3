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
from tests.scenarios import nan_origin
from tests.scenarios.harness import Expect, Scenario, Truth

AT = 3


class Attention(nan_origin.Injecting):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, *, hidden_states: torch.Tensor) -> Any:
        return self.proj(nan_origin.NaNGrad.apply(hidden_states, self, AT))  # type: ignore[no-untyped-call]


def run(out: Path) -> tuple[Session, Truth]:
    r = nan_origin.train(out, lambda dim: nan_origin.Layer(dim, Attention), masked=False)
    attn, names = r.one(Attention), r.names
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
    return r.session, Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-keyword-input-backward",
    "A module called by keyword makes NaN in its own backward (its keyword input's gradient) "
    "at step 3 of 6 (FP32).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
