"""A module called by keyword changes its keyword input in place to inf at step 2 of 6 (FP32),
before its child uses it.

The layer calls ``attn(hidden_states=h)``, ``h`` its LayerNorm's (finite) output. At step 2
``attn`` multiplies ``h`` by inf in place (the injection), then hands it to its child
``proj``. The keyword input is read after the forward, when it is already inf: taken as the
value ``attn`` was given, it would blame the layer's own code before ``attn``. ``h`` changed
in place during the forward (its version counter moved), so it is not: the inf is ``attn``'s
own code, before ``proj``.

Truth, recorded at the injection without ampdiag: the attention checks that ``h`` is finite
before its in-place multiply and not after, and records the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ampdiag.session import Session
from tests.scenarios import nan_origin
from tests.scenarios.harness import Expect, Scenario, Truth

AT = 2


class Attention(nan_origin.Injecting):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, *, hidden_states: torch.Tensor) -> Any:
        if self.now == AT:  # the injection: in place, in its own code
            finite_before = bool(torch.isfinite(hidden_states).all())
            hidden_states.mul_(float("inf"))
            if finite_before and not bool(torch.isfinite(hidden_states).all()):
                self.fired.append(self.now)
        return self.proj(hidden_states)


def run(out: Path) -> tuple[Session, Truth]:
    r = nan_origin.train(out, lambda dim: nan_origin.Layer(dim, Attention), masked=False)
    attn, names = r.one(Attention), r.names
    # the divergence replay runs the step's forward again: the same step, once more
    assert set(attn.fired) == {AT}, attn.fired
    between = [None, names[attn.proj]]
    measured = {"first_step": attn.fired[0], "module": names[attn], "between": between}
    expect = Expect(
        "nonfinite-origin",
        module=names[attn],
        step=attn.fired[0],
        evidence={
            "phase": ("forward", 0.0),
            "parent_code": (True, 0.0),
            "between": (between, 0.0),
        },
    )
    return r.session, Truth(expect=[expect], measured=measured)


SCENARIO = Scenario(
    "nan-keyword-inplace",
    "A module called by keyword turns its keyword input inf in place at step 2 of 6, before "
    "its child uses it (FP32).",
    run,
    forbid=frozenset({"prefer-bf16", "tune-grad-scaler", "fp16-grad-underflow"}),
)
