"""Healthy control for the divergence scenarios: the same MLP at a learning rate (5) that
stays finite in FP32, BF16 and FP16 + GradScaler (measured without ampdiag).

No diverged or stalled, whatever the scaler's start-up skips.
"""

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios.divergence import _lr_loop
from tests.scenarios.harness import Scenario, Truth


def run(out: Path) -> tuple[Session, Truth]:
    bad = {name: _lr_loop(dt, 5.0, None)[1] for name, dt in
           (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16))}  # fmt: skip
    assert not any(bad.values()), bad
    _, _, session = _lr_loop(torch.float16, 5.0, out)
    assert session is not None
    return session, Truth(measured={"nonfinite_steps": bad})


SCENARIO = Scenario(
    "diverge-healthy-lr",
    "The MLP at SGD lr 5 in FP16 + GradScaler: finite in every precision (measured).",
    run,
    forbid=frozenset({"diverged", "stalled"}),
)
